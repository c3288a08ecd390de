package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// The deployment table holds what belongs to the deployment, not to one control plane on
// it: the owner tags its replicas carry (the local provider's process tag, the owner label
// of its pods). Control planes sharing one database have their own home directories, so an
// owner derived from a home would differ between them, and a leader taking over would not
// find (and so would leak) the replicas the one before it launched. The first control plane
// to open the store writes the owner; every later one, on any home, reads the same.

// Owner keys of the deployment table.
const (
	LocalOwnerKey    = "local_owner"    // the local and sim providers' process tag
	ProviderOwnerKey = "provider_owner" // the owner label of pods and instances elsewhere
)

// DeploymentValue returns the deployment's value under key. When the store has none yet, it
// stores seed's (seed runs only then) unless another control plane stored one first, and
// returns whichever the store kept. The write is not a leader's decision: it is made once,
// before any lease is held, and the same by every control plane that makes it, so it is not
// fenced.
func (s *Store) DeploymentValue(ctx context.Context, key string, seed func() (string, error)) (string, error) {
	if v, err := s.deploymentValue(ctx, key); err == nil || !errors.Is(err, sql.ErrNoRows) {
		return v, err
	}
	v, err := seed()
	if err != nil {
		return "", fmt.Errorf("deployment %s: %w", key, err)
	}
	if strings.TrimSpace(v) == "" {
		return "", fmt.Errorf("deployment %s: an empty value", key)
	}
	wctx, cancel := s.bound(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(wctx, s.q(`INSERT INTO deployment (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`), key, v); err != nil {
		return "", fmt.Errorf("deployment %s: store it: %w", key, s.wrote(wctx, err))
	}
	return s.deploymentValue(ctx, key)
}

func (s *Store) deploymentValue(ctx context.Context, key string) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, s.q(`SELECT value FROM deployment WHERE key = ?`), key).Scan(&v)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		err = fmt.Errorf("deployment %s: %w", key, err)
	}
	return v, err
}

// Deployment returns every value of the deployment table (the owners), by key.
func (s *Store) Deployment(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT key, value FROM deployment`)
	if err != nil {
		return nil, fmt.Errorf("deployment: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("deployment: %w", err)
		}
		out[k] = v
	}
	return out, rows.Err()
}
