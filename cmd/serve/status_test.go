package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/state"
)

// The replica table shows each replica's GPU and its predicted $ per million tokens at the
// SLO beside its $/hour: a figure where the control plane predicted one, "misses SLO" where
// the GPU cannot meet it, "-" where no profile is known.
func TestReplicaTableShowsDollarsPerTokenAtTheSLO(t *testing.T) {
	svcs := []control.ServiceStatus{{Name: "llm", Replicas: []state.Replica{
		{ID: "llm-1", Service: "llm", Provider: "aws", Region: "us-east-1", Zone: "a", Capacity: "on_demand", Accelerator: "H100", PricePerHour: 2.5, State: "ready"},
		{ID: "llm-2", Service: "llm", Provider: "aws", Region: "us-east-1", Zone: "b", Capacity: "spot", Accelerator: "T4", PricePerHour: 0.2, State: "ready"},
		{ID: "llm-3", Service: "llm", Provider: "local", Capacity: "reserved", State: "starting"},
	}, PerToken: map[string]control.PerToken{
		"llm-1": {DollarsPerMillionTokens: 0.029, TokensPerSecond: 23975},
		"llm-2": {TokensPerSecond: 0, Why: "cannot hold the model"},
	}}}
	var out bytes.Buffer
	printReplicas(&out, svcs)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("table:\n%s", out.String())
	}
	head := strings.Fields(strings.ReplaceAll(lines[0], "$/M TOKENS AT SLO", "$/M_TOKENS_AT_SLO"))
	col := -1
	for i, h := range head {
		if h == "$/M_TOKENS_AT_SLO" {
			col = i
		}
	}
	if col < 0 || head[col-1] != "$/HOUR" || head[col-2] != "GPU" {
		t.Fatalf("header %q: want GPU, $/HOUR and $/M TOKENS AT SLO side by side", lines[0])
	}
	for i, want := range [][3]string{{"H100", "2.50", "0.0290"}, {"T4", "0.20", "misses"}, {"-", "0.00", "-"}} {
		f := strings.Fields(lines[i+1])
		if f[col-2] != want[0] || f[col-1] != want[1] || f[col] != want[2] {
			t.Errorf("row %d %q: want GPU %s, $/hour %s, $/M %s", i+1, lines[i+1], want[0], want[1], want[2])
		}
	}
}

// The adapters table lists each declared LoRA adapter's use and cost; no table without any.
func TestAdaptersTable(t *testing.T) {
	var out bytes.Buffer
	printAdapters(&out, []control.ServiceStatus{{Name: "llm"}})
	if out.Len() != 0 {
		t.Fatalf("a service without adapters printed %q", out.String())
	}
	printAdapters(&out, []control.ServiceStatus{{Name: "llm", Adapters: []control.AdapterUse{{Name: "fin", Requests: 12, Tokens: 3400, Dollars: 0.0125}, {Name: "sql"}}}})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[2]), " ") != "llm fin 12 3400 0.0125" || !strings.HasPrefix(lines[3], "llm") {
		t.Errorf("adapters table:\n%s", out.String())
	}
}

// The tenants table lists each tenant's spend today and this month.
func TestTenantsTable(t *testing.T) {
	var out bytes.Buffer
	writeTenants(&out, fleet.LoadAnswer{Day: "2026-11-30", Tenants: []fleet.TenantSpend{{Tenant: "acme", DayDollars: 1.25, MonthDollars: 40.5, DayTokens: 1200, MonthTokens: 99000}}})
	want := "Tenants (spend at the replicas' $ per token; UTC day 2026-11-30 and its month)\nTENANT  $ TODAY  $ THIS MONTH  TOKENS TODAY  TOKENS THIS MONTH\nacme    1.2500   40.5000       1200          99000\n"
	if got := strings.TrimLeft(out.String(), "\n"); got != want {
		t.Errorf("tenants table:\n%q\nwant\n%q", got, want)
	}
}
