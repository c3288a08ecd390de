// Package kubelease elects the leader of several control planes sharing one store with a
// Kubernetes Lease (coordination.k8s.io/v1), through client-go's leaderelection, as
// controllers on Kubernetes do. The Lease elects; the store's term fences: once elected, a
// control plane takes the store's next term (state.Lease.Take), and every write of the one
// before it (a process that was paused or cut off and still believes it leads) is refused
// by the store. A control plane that the Lease stops electing stops leading at its next
// renewal.
package kubelease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/arbiter-serve/arbiter/state"
)

// Config is one control plane's candidacy.
type Config struct {
	// Client reaches the cluster's Leases.
	Client coordinationv1.LeasesGetter
	// Namespace and Name are the Lease's (Name default: DefaultName).
	Namespace, Name string
	// Holder names this control plane in the Lease (its holderIdentity) and in the store.
	Holder string
	// Duration is the Lease's: how long a leader that stops renewing keeps it. It renews
	// within two thirds of it and candidates retry every fifth.
	Duration time.Duration
	// Store is the state store the control planes share: its term fences the leader's
	// writes.
	Store *state.Store
	Log   *slog.Logger
	// Now is the clock the store's term expires by (nil: time.Now); client-go's elector
	// keeps its own.
	Now func() time.Time
}

// DefaultName is the Lease's name when Config.Name is empty.
const DefaultName = "arbiter-control"

// Client makes a Lease client from a kubeconfig file, or, with path empty, from the pod's
// service account (in the cluster).
func Client(path string) (coordinationv1.LeasesGetter, error) {
	var cfg *rest.Config
	var err error
	if path == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes lease: not in a cluster (%w); give a kubeconfig", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
		return nil, fmt.Errorf("kubernetes lease: kubeconfig %s: %w", path, err)
	}
	return coordinationv1.NewForConfig(cfg)
}

// Lease is a control plane's candidacy for a Kubernetes Lease, and the store term it takes
// when elected. It satisfies control.Lease.
type Lease struct {
	cfg   Config
	store *state.Lease

	// elected: the Lease is this control plane's now, by client-go's elector; fresh: it
	// was elected since the store's term was last taken (one take per election, so that
	// a control plane deposed in the store while its elector still believes it leads does
	// not take the term back).
	elected, fresh atomic.Bool

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Start runs the candidacy until ctx ends or Release.
func Start(ctx context.Context, cfg Config) (*Lease, error) {
	if cfg.Client == nil || cfg.Store == nil {
		return nil, errors.New("kubernetes lease: a client and a store are required")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubernetes lease: a namespace is required (--lease-namespace)")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Duration < 2*time.Second {
		return nil, fmt.Errorf("kubernetes lease: duration %v is too short; use 2s or more (15s, as Kubernetes' own controllers, is a good start)", cfg.Duration)
	}
	st, err := cfg.Store.NewElectedLease(cfg.Holder, cfg.Duration, cfg.Now)
	if err != nil {
		return nil, err
	}
	l := &Lease{cfg: cfg, store: st, done: make(chan struct{})}
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client: cfg.Client, LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Holder}}
	elcfg := leaderelection.LeaderElectionConfig{Lock: lock, Name: cfg.Name,
		LeaseDuration: cfg.Duration, RenewDeadline: cfg.Duration * 2 / 3, RetryPeriod: cfg.Duration / 5,
		// Not client-go's ReleaseOnCancel: its release checks the elector's last view of
		// the Lease, not the Lease it has just read, so an elector deposed while cut off
		// gives up its successor's Lease (seen on the test apiserver). Release does it.
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				l.fresh.Store(true)
				l.elected.Store(true)
				cfg.Log.Info("kubernetes lease: elected", "lease", cfg.Namespace+"/"+cfg.Name, "holder", cfg.Holder)
			},
			OnStoppedLeading: func() {
				l.elected.Store(false)
				cfg.Log.Info("kubernetes lease: no longer elected", "lease", cfg.Namespace+"/"+cfg.Name, "holder", cfg.Holder)
			},
		}}
	if _, err := leaderelection.NewLeaderElector(elcfg); err != nil {
		return nil, fmt.Errorf("kubernetes lease: %w", err)
	}
	ctx, l.cancel = context.WithCancel(ctx)
	go func() {
		defer close(l.done)
		// Run returns when the Lease is lost or ctx ends; a lost Lease is stood for again.
		for ctx.Err() == nil {
			le, err := leaderelection.NewLeaderElector(elcfg)
			if err != nil { // checked above; the config does not change
				cfg.Log.Error("kubernetes lease", "err", err)
				return
			}
			le.Run(ctx)
		}
	}()
	return l, nil
}

// Holder is this control plane's name in the Lease.
func (l *Lease) Holder() string { return l.cfg.Holder }

// TTL is the Lease's duration.
func (l *Lease) TTL() time.Duration { return l.cfg.Duration }

// Leading is the store term this control plane leads: 0 unless the Lease elects it and it
// holds the store's current term.
func (l *Lease) Leading() int64 {
	if !l.elected.Load() {
		return 0
	}
	return l.store.Leading()
}

// Renew takes the store's next term once per election, and extends it while the Lease
// elects this control plane; it returns the term led (0: none).
func (l *Lease) Renew(ctx context.Context) (int64, error) {
	if !l.elected.Load() {
		// Not elected (any more): write nothing under the term held, if any.
		return 0, l.store.Release(ctx)
	}
	if l.fresh.CompareAndSwap(true, false) {
		term, err := l.store.Take(ctx)
		if err != nil {
			l.fresh.Store(true) // taken at the next renewal
		}
		return term, err
	}
	return l.store.Renew(ctx)
}

// Release ends the candidacy, gives the Lease up if it is this control plane's (so that
// the next is elected at once, without waiting it out), and the store term.
func (l *Lease) Release(ctx context.Context) error {
	var err error
	l.once.Do(func() {
		l.cancel()
		<-l.done
		l.elected.Store(false)
		err = l.giveUp(ctx)
	})
	return errors.Join(err, l.store.Release(ctx))
}

// giveUp empties the Lease's holder if the Lease, as read now, is this control plane's; the
// update carries the read's resourceVersion, so it cannot overwrite a successor's.
func (l *Lease) giveUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Duration)
	defer cancel()
	leases := l.cfg.Client.Leases(l.cfg.Namespace)
	lease, err := leases.Get(ctx, l.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kubernetes lease: give it up: %w", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != l.cfg.Holder {
		return nil
	}
	now := metav1.NewMicroTime(time.Now())
	one := int32(1)
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = nil, &one, &now
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("kubernetes lease: give it up: %w", err)
	}
	return nil
}
