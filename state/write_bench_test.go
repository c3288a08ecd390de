package state

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// BenchmarkStateWrite is the cost of one replica state change (SaveReplica: the row and its
// event in one committed transaction) on SQLite and on PostgreSQL over loopback, the two
// interleaved so that both see the same machine; it reports each one's time per write and
// their ratio. Both are durable: SQLite's synchronous=FULL, PostgreSQL's default fsync and
// synchronous_commit.
func BenchmarkStateWrite(b *testing.B) {
	ctx := context.Background()
	open := func(setting string) (*Store, Replica) {
		s, err := OpenSetting(ctx, setting, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		now := time.Now()
		if _, err := s.PutService(ctx, "svc", "run: x", "", now); err != nil {
			b.Fatal(err)
		}
		r, err := s.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, now)
		if err != nil {
			b.Fatal(err)
		}
		return s, r
	}
	lite, lr := open(filepath.Join(b.TempDir(), "state.db"))
	pg, pr := open(pgtest.DSN(b))
	var tl, tp time.Duration
	states := [2]string{"starting", "ready"}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		prev, next := states[i%2], states[(i+1)%2]
		for _, w := range []struct {
			s   *Store
			r   *Replica
			sum *time.Duration
		}{{lite, &lr, &tl}, {pg, &pr, &tp}} {
			w.r.State, w.r.Reason = next, fmt.Sprintf("write %d", i)
			start := time.Now()
			if err := w.s.SaveReplica(ctx, *w.r, prev, time.Now()); err != nil {
				b.Fatal(err)
			}
			*w.sum += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(tl.Microseconds())/n, "sqlite-µs/write")
	b.ReportMetric(float64(tp.Microseconds())/n, "postgres-µs/write")
	b.ReportMetric(float64(tp)/float64(tl), "postgres/sqlite")
}
