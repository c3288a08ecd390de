package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

// replicaFile is the standalone router's replica list:
//
//	replicas:
//	  - {id: a, address: 127.0.0.1:8001, model: m, capacity: reserved, price_per_hour: 2.5}
//	  - {id: b, address: 127.0.0.1:8002, model: m, price_per_hour: 0.8, accelerator: L4}
//
// accelerator (the catalogs' GPU name) or profile (an engine profile) says what the
// router predicts a replica with (fleet.Replica).
type replicaFile struct {
	Replicas []fleet.Replica `yaml:"replicas"`
}

// ParseReplicaFile parses and validates a replica list; unknown keys are errors.
func ParseReplicaFile(b []byte) ([]fleet.Replica, error) {
	var f replicaFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if err := fleet.ValidateSet(f.Replicas); err != nil {
		return nil, err
	}
	for i, r := range f.Replicas {
		// A replica's GPU or profile the router cannot model would be predicted as the
		// default's: the file's author hears of it now, not from a wrong pick later.
		if r.Profile != "" {
			if err := engine.CheckProfileName(r.Profile); err != nil {
				return nil, fmt.Errorf("replicas[%d] (%s): profile: %w", i, r.ID, err)
			}
		}
		if r.Accelerator != "" {
			if _, err := engine.LookupGPU(r.Accelerator); err != nil {
				return nil, fmt.Errorf("replicas[%d] (%s): accelerator: %w", i, r.ID, err)
			}
		}
	}
	return f.Replicas, nil
}

// WatchReplicaFile loads path into the pool now and again whenever it changes, until ctx
// ends. A bad edit is logged and ignored: the router keeps the last good set.
func WatchReplicaFile(ctx context.Context, path string, pool *Pool, log *slog.Logger, every time.Duration) error {
	return watchFile(ctx, path, "replica file", log, every, func(b []byte) error {
		set, err := ParseReplicaFile(b)
		if err != nil {
			return err
		}
		pool.SetReplicas(set)
		return nil
	})
}

// watchFile applies path's content now (an error here is returned) and again whenever its
// modification time changes, until ctx ends; a later bad edit is logged and the last good
// content stays in force.
func watchFile(ctx context.Context, path, what string, log *slog.Logger, every time.Duration, apply func([]byte) error) error {
	load := func() (time.Time, error) {
		st, err := os.Stat(path)
		if err != nil {
			return time.Time{}, err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return time.Time{}, err
		}
		if err := apply(b); err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", path, err)
		}
		return st.ModTime(), nil
	}
	mtime, err := load()
	if err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			st, err := os.Stat(path)
			if err != nil || st.ModTime().Equal(mtime) {
				continue
			}
			if m, err := load(); err != nil {
				log.Error(what+" rejected; keeping the previous one", "err", err)
				mtime = st.ModTime()
			} else {
				mtime = m
				log.Info(what+" reloaded", "path", path)
			}
		}
	}()
	return nil
}
