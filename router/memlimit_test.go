package router

import "testing"

func TestMemoryLimitFollowsTheBudgets(t *testing.T) {
	cfg := Defaults()
	limit, ok := memoryLimit(&cfg, "")
	if want := int64(cfg.MaxBodyBufferBytes) + parseBudget(&cfg) + 256<<20; !ok || limit != want {
		t.Fatalf("default limit %d (%v), want the body budgets plus 256 MiB, %d", limit, ok, want)
	}
	if _, ok := memoryLimit(&cfg, "1GiB"); ok {
		t.Fatal("GOMEMLIMIT is set: the router must leave the runtime's limit alone")
	}
	cfg.MemoryLimitBytes = 3 << 30
	if limit, ok := memoryLimit(&cfg, ""); !ok || limit != 3<<30 {
		t.Fatalf("memory_limit_bytes 3 GiB gave %d (%v)", limit, ok)
	}
	cfg.MemoryLimitBytes = -1
	if _, ok := memoryLimit(&cfg, ""); ok {
		t.Fatal("memory_limit_bytes -1 must set no limit")
	}
}
