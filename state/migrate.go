package state

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// The schema's versions, one folder per database; goose records the versions applied in
// the table goose_db_version of the same database.
//
//go:embed migrations
var migrations embed.FS

// migrate brings the store's schema to the newest version. On PostgreSQL several control
// planes may start at once against one database: goose's session locker (an advisory lock)
// lets one migrate while the others wait.
func (s *Store) migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrations, "migrations/"+s.d.name)
	if err != nil {
		return err
	}
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true), goose.WithLogger(goose.NopLogger())}
	dialect := goose.DialectSQLite3
	if s.d.postgres {
		dialect = goose.DialectPostgres
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 120))
		if err != nil {
			return err
		}
		// 00002 added a column that PostgreSQL's 00001 already has: recorded, nothing run, so
		// a version number means the same schema in both.
		opts = append(opts, goose.WithSessionLocker(locker), goose.WithGoMigrations(goose.NewGoMigration(2, nil, nil)))
	} else {
		opts = append(opts, goose.WithGoMigrations(
			goose.NewGoMigration(2, &goose.GoFunc{RunTx: addReplicaColumn("price_source")}, nil),
			goose.NewGoMigration(3, &goose.GoFunc{RunTx: addReplicaColumn("accelerator")}, nil),
			goose.NewGoMigration(6, &goose.GoFunc{RunTx: addColumn("leader", "address")}, nil),
			goose.NewGoMigration(8, &goose.GoFunc{RunTx: addReplicaColumn("launcher")}, nil),
			goose.NewGoMigration(11, &goose.GoFunc{RunTx: addReplicaColumn("adapter")}, nil)))
	}
	p, err := goose.NewProvider(dialect, s.db, sub, opts...)
	if err != nil {
		return fmt.Errorf("schema migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("schema migrations: %w", err)
	}
	return nil
}

// addReplicaColumn is a SQLite migration that gives replicas a text column (00002:
// price_source; 00003: accelerator, the GPU a replica was placed on; 00008: launcher, where
// the control plane that launched it answers; 00011: adapter, the LoRA adapter a replica of
// its own serves merged). A state file made by a
// version that created the column itself, before migrations were versioned, has it already
// (SQLite has no ADD COLUMN IF NOT EXISTS).
func addReplicaColumn(col string) func(context.Context, *sql.Tx) error {
	return addColumn("replicas", col)
}

// addColumn is a SQLite migration that gives table a text column (empty by default), unless it
// has it already: a file whose recorded versions were lost keeps its columns (00006:
// leader.address, where the leader's API answers, as PostgreSQL's
// 00006_leader_address.sql).
func addColumn(table, col string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info('`+table+`') WHERE name = ?`, col).Scan(&n); err != nil {
			return fmt.Errorf("read %s' columns: %w", table, err)
		}
		if n > 0 {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN `+col+` TEXT NOT NULL DEFAULT ''`); err != nil {
			return fmt.Errorf("add %s.%s: %w", table, col, err)
		}
		return nil
	}
}
