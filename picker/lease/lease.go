// Package lease makes one of several endpoint pickers the one that picks (active-passive),
// for users who prefer one decider to several that each see part of the traffic: the
// pickers campaign for a Kubernetes Lease (coordination.k8s.io/v1) through client-go's
// leaderelection, and only the holder reports ready, so the gateway sends every request to
// it, as GIE's own endpoint picker does with --ha-enable-leader-election. The others keep
// their view of the pool warm and take over when the holder stops renewing.
//
// client-go's leaderelection imports the clientset and informers, which register every API
// group; the picker links them through this package alone (picker/inferencepool's
// TestPickerBinaryLinksNoControlPlane), as the autoscaler does through control/kubelease.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Config is one picker's candidacy.
type Config struct {
	// Rest reaches the cluster (or Client, if given: a Lease client of its own).
	Rest            *rest.Config
	Client          coordinationv1.LeasesGetter
	Namespace, Name string
	// Holder names this picker in the Lease (its holderIdentity): unique among the pickers.
	Holder string
	// Duration is the Lease's: how long a holder that stops renewing keeps it (default 15 s,
	// client-go's and GIE's). The holder renews within two thirds of it; the others retry
	// every fifth of it.
	Duration time.Duration
	Log      *slog.Logger
}

// DefaultDuration is the Lease's duration when Config.Duration is zero.
const DefaultDuration = 15 * time.Second

// Campaign runs the candidacy until ctx ends and returns whether this picker holds the
// Lease now. At ctx's end a holder gives the Lease up at once, so another picker takes over
// without waiting for it to expire.
func Campaign(ctx context.Context, cfg Config) (held func() bool, err error) {
	if cfg.Client == nil && cfg.Rest != nil {
		c, err := coordinationv1.NewForConfig(cfg.Rest)
		if err != nil {
			return nil, fmt.Errorf("picker lease: %w", err)
		}
		cfg.Client = c
	}
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Name == "" || cfg.Holder == "" {
		return nil, errors.New("picker lease: a cluster, namespace, name and holder are required")
	}
	if cfg.Duration == 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Duration < 3*time.Second {
		return nil, fmt.Errorf("picker lease: duration %s: want at least 3s (it renews within two thirds of it)", cfg.Duration)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var holds atomic.Bool
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     cfg.Client,
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Holder},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.Duration,
		RenewDeadline:   cfg.Duration * 2 / 3,
		RetryPeriod:     cfg.Duration / 5,
		ReleaseOnCancel: true,
		Name:            cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				holds.Store(true)
				log.Info("picker lease held: this picker picks (ready)", "lease", cfg.Namespace+"/"+cfg.Name, "holder", cfg.Holder)
			},
			OnStoppedLeading: func() {
				holds.Store(false)
				log.Warn("picker lease lost: this picker stands by (not ready)", "lease", cfg.Namespace+"/"+cfg.Name, "holder", cfg.Holder)
			},
			OnNewLeader: func(id string) {
				if id != cfg.Holder {
					log.Info("picker lease held by another picker: standing by", "lease", cfg.Namespace+"/"+cfg.Name, "holder", id)
				}
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("picker lease: %w", err)
	}
	go func() {
		// Run returns when the Lease is lost (or ctx ends): campaign again.
		for ctx.Err() == nil {
			le.Run(ctx)
		}
	}()
	return holds.Load, nil
}
