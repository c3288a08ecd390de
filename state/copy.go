package state

import (
	"context"
	"database/sql"
	"fmt"
)

// CopyCounts is what Copy wrote.
type CopyCounts struct {
	Services, Versions, Replicas, Events, AdapterUses, TenantSpends int
}

// copyTables are the tables Copy moves, parents first, with their columns.
var copyTables = []struct{ name, cols string }{
	{"services", "name, version, status, next_seq, tokens, created_at, updated_at"},
	{"versions", "service, version, spec, envs, setup_done, created_at"},
	{"replicas", replicaCols},
	{"events", "id, at, service, replica, kind, message"},
	{"adapter_use", "service, adapter, requests, tokens, since"},
	{"tenant_spend", "tenant, day, dollars, tokens, requests"},
}

// Copy writes everything in src into dst, which must hold nothing yet: services with their
// replica sequence numbers and token totals, versions, replicas with their provider handles
// (so the control plane that opens dst adopts what runs), the event log with its IDs, and
// each LoRA adapter's use and each tenant's spend per day.
// src is read in one transaction and dst written in one, so dst gets all of it or none.
// Nothing may write src meanwhile: stop the control plane that owns it first.
func Copy(ctx context.Context, dst, src *Store) (CopyCounts, error) {
	var n CopyCounts
	for _, t := range copyTables {
		var k int
		if err := dst.db.QueryRowContext(ctx, `SELECT count(*) FROM `+t.name).Scan(&k); err != nil {
			return n, fmt.Errorf("copy: read the destination's %s: %w", t.name, err)
		}
		if k > 0 {
			return n, fmt.Errorf("copy: the destination already holds %d %s rows; copy only into an empty store", k, t.name)
		}
	}
	rtx, err := src.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return n, fmt.Errorf("copy: read the source: %w", err)
	}
	defer rtx.Rollback()
	wtx, err := dst.db.BeginTx(ctx, nil)
	if err != nil {
		return n, fmt.Errorf("copy: write the destination: %w", err)
	}
	defer wtx.Rollback()
	counts := []*int{&n.Services, &n.Versions, &n.Replicas, &n.Events, &n.AdapterUses, &n.TenantSpends}
	for i, t := range copyTables {
		c, err := copyTable(ctx, dst, wtx, rtx, t.name, t.cols)
		if err != nil {
			return n, err
		}
		*counts[i] = c
	}
	// The owners move with the replicas they tag, or the control plane opening dst would
	// not find them. dst holds no replicas (checked above), so owners a control plane wrote
	// there on opening it tag nothing yet: src's replace them.
	if err := copyDeployment(ctx, dst, wtx, rtx); err != nil {
		return n, err
	}
	if dst.d.postgres {
		// The identity's next value follows the copied IDs.
		if _, err := wtx.ExecContext(ctx, `SELECT setval(pg_get_serial_sequence('events', 'id'), (SELECT coalesce(max(id), 0) + 1 FROM events), false)`); err != nil {
			return n, fmt.Errorf("copy: events' ID sequence: %w", err)
		}
	}
	if err := wtx.Commit(); err != nil {
		return n, fmt.Errorf("copy: commit: %w", err)
	}
	return n, nil
}

func copyTable(ctx context.Context, dst *Store, wtx, rtx *sql.Tx, table, cols string) (int, error) {
	rows, err := rtx.QueryContext(ctx, `SELECT `+cols+` FROM `+table)
	if err != nil {
		return 0, fmt.Errorf("copy: read %s: %w", table, err)
	}
	defer rows.Close()
	types, err := rows.ColumnTypes()
	if err != nil {
		return 0, err
	}
	marks := "?"
	for range len(types) - 1 {
		marks += ", ?"
	}
	ins, err := wtx.PrepareContext(ctx, dst.q(`INSERT INTO `+table+` (`+cols+`) VALUES (`+marks+`)`))
	if err != nil {
		return 0, fmt.Errorf("copy: write %s: %w", table, err)
	}
	defer ins.Close()
	vals := make([]any, len(types))
	ptrs := make([]any, len(types))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	n := 0
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return n, fmt.Errorf("copy: read %s: %w", table, err)
		}
		if _, err := ins.ExecContext(ctx, vals...); err != nil {
			return n, fmt.Errorf("copy: write %s row %d: %w", table, n+1, err)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("copy: read %s: %w", table, err)
	}
	return n, nil
}

// copyDeployment writes src's deployment values (its owners) over dst's.
func copyDeployment(ctx context.Context, dst *Store, wtx, rtx *sql.Tx) error {
	rows, err := rtx.QueryContext(ctx, `SELECT key, value FROM deployment`)
	if err != nil {
		return fmt.Errorf("copy: read deployment: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("copy: read deployment: %w", err)
		}
		if _, err := wtx.ExecContext(ctx, dst.q(`INSERT INTO deployment (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`), k, v); err != nil {
			return fmt.Errorf("copy: write deployment %s: %w", k, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("copy: read deployment: %w", err)
	}
	return nil
}
