package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/state"
)

// ErrExists is returned by Create for a name already in use.
var ErrExists = errors.New("already exists")

// ErrModelTaken is returned by Create and Update for a spec that claims a model another
// service serves: the router would attribute its tokens and load to one of the two.
var ErrModelTaken = errors.New("model already served")

// modelHolder names the service other than name that serves one of sp's models, and which
// model; "" when there is none. Caller holds c.mu.
func (c *Controller) modelHolder(name string, sp *spec.Service) (holder, model string) {
	for other, s := range c.services {
		if other == name || s.deleting {
			continue
		}
		// An adapter's name is a model name clients send, as the models are.
		names := slices.Clone(sp.Arbiter.Models)
		for _, a := range sp.Arbiter.Adapters {
			names = append(names, a.Name)
		}
		for _, m := range names {
			if slices.Contains(s.models(), m) {
				return other, m
			}
		}
	}
	return "", ""
}

func modelTaken(name, holder, model string) error {
	return fmt.Errorf("service %q: model %q is served by service %q; two services cannot serve one model name (give this one another arbiter.model, or `serve update %s` instead): %w",
		name, model, holder, holder, ErrModelTaken)
}

// ErrNotFound is returned for an unknown service.
var ErrNotFound = state.ErrNotFound

// Vars are the values a submission gives beside its file: --env and --secret. They add to
// the spec's envs and secrets and fill the ones it leaves null (SkyServe's "give it at
// launch").
type Vars struct {
	Envs, Secrets map[string]string
}

// embeddedCatalog is the price catalogs shipped in the binary, parsed once (0.1–0.2 s).
var embeddedCatalog = sync.OnceValues(pricing.Embedded)

// parseSpec validates a submitted spec; the file name is only for messages.
func (c *Controller) parseSpec(name, text string, v Vars) (*spec.Service, error) {
	sp, err := spec.ParseWith(name+".yaml", []byte(text), spec.Overrides{Envs: v.Envs, Secrets: v.Secrets})
	if err != nil {
		return nil, err
	}
	// As the CLI does before it submits (serve up's warnings): names spelled as the
	// catalogs spell them, and what nothing can price or run left out, so that placement
	// and the providers see what runs; a file left with nothing is refused.
	if len(sp.AcceleratorNames()) > 0 {
		cat, err := embeddedCatalog()
		if err != nil {
			return nil, err
		}
		if _, err := pricing.Resolve(sp, cat); err != nil {
			return nil, err
		}
	}
	// spec validation applies these rules too (scaling's FuzzAcceptedSpecsRun keeps them in
	// step); checked again here so that nothing the decider or the placer would refuse is
	// ever stored.
	if err := scaling.ConfigFromSpec(sp).Validate(); err != nil {
		return nil, fmt.Errorf("%w: autoscaling: %v", errBadRequest, err)
	}
	if err := scaling.PlacementFromSpec(sp, c.cfg.ZoneCooldown).Validate(); err != nil {
		return nil, fmt.Errorf("%w: placement: %v", errBadRequest, err)
	}
	if err := c.checkSize(sp); err != nil {
		return nil, err
	}
	for _, name := range sp.Arbiter.Providers {
		if name == kubernetesPrefix && len(c.expandProviders([]string{name})) == 0 {
			return nil, fmt.Errorf("%w: arbiter.providers: no kubernetes cluster is configured in this control plane (list clusters in its providers file; configured: %v)", errBadRequest, c.providerNames())
		}
	}
	for _, name := range c.expandProviders(sp.Arbiter.Providers) {
		p, err := c.provider(name)
		if err != nil {
			return nil, fmt.Errorf("%w: arbiter.providers: %v (configured: %v)", errBadRequest, err, c.providerNames())
		}
		if sc, ok := p.(specChecker); ok {
			if err := sc.CheckSpec(sp); err != nil {
				return nil, fmt.Errorf("%w: %v", errBadRequest, err)
			}
		}
	}
	return sp, nil
}

// checkSize refuses a service larger than this control plane may run (its ceiling) or than
// its providers can hold at once, where every one of them knows its bound.
func (c *Controller) checkSize(sp *spec.Service) error {
	rp := sp.Service.ReplicaPolicy
	want := max(rp.MaxReplicas, rp.MinReplicas) + rp.NumOverprovision
	if want > c.cfg.MaxReplicas {
		return fmt.Errorf("%w: the service may run up to %d replicas (max_replicas %d, num_overprovision %d); this control plane runs at most %d, all services together (serve daemon --max-replicas)",
			errBadRequest, want, rp.MaxReplicas, rp.NumOverprovision, c.cfg.MaxReplicas)
	}
	hold, names := 0, c.expandProviders(sp.Arbiter.Providers)
	for _, name := range names {
		p, err := c.provider(name)
		if err != nil {
			return nil // reported with its reason by the provider check
		}
		b, ok := p.(replicas.Bounded)
		if !ok || b.MaxReplicas() <= 0 {
			return nil // a provider with no known bound (a cluster: its scheduler decides)
		}
		hold += b.MaxReplicas()
	}
	// A bounded provider counts nodes (the local machine's processes): a replica of
	// num_nodes nodes takes that many.
	if n := max(1, sp.NumNodes); len(names) > 0 && want*n > hold {
		return fmt.Errorf("%w: the service may run up to %d replicas of %d node(s) each; its providers (%v) hold at most %d nodes at once (serve daemon --local-max-replicas)",
			errBadRequest, want, n, names, hold)
	}
	return nil
}

// specChecker is a provider that can refuse a spec it could never serve (a market whose
// trace or accelerators do not exist) before the service is accepted.
type specChecker interface {
	CheckSpec(sp *spec.Service) error
}

func (c *Controller) providerNames() []string {
	var out []string
	for n := range c.cfg.Providers {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// parseStored loads a stored version with the --env and --secret values it was submitted
// with.
func parseStored(name string, v state.Version) (*spec.Service, error) {
	vars, err := storedVars(v.Envs)
	if err != nil {
		return nil, fmt.Errorf("service %s version %d: stored envs: %w", name, v.Version, err)
	}
	return spec.ParseWith(name+".yaml", []byte(v.Spec), spec.Overrides{Envs: vars.Envs, Secrets: vars.Secrets})
}

// storedVars reads a version's stored values: a flat map of --env values (what versions
// without secrets store, and all that earlier versions stored), or {"v": 2, "envs": …,
// "secrets": …} (a flat map's values are strings, so a numeric "v" cannot be one).
func storedVars(text string) (Vars, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &probe); err != nil {
		return Vars{}, err
	}
	if raw, ok := probe["v"]; ok && len(raw) > 0 && raw[0] != '"' {
		var v struct {
			Envs    map[string]string `json:"envs"`
			Secrets map[string]string `json:"secrets"`
		}
		err := json.Unmarshal([]byte(text), &v)
		return Vars{Envs: v.Envs, Secrets: v.Secrets}, err
	}
	var envs map[string]string
	err := json.Unmarshal([]byte(text), &envs)
	return Vars{Envs: envs}, err
}

// storedMode reads the update mode a version was stored with.
func storedMode(text string) string {
	var v struct {
		V    any    `json:"v"`
		Mode string `json:"mode"`
	}
	if json.Unmarshal([]byte(text), &v) != nil {
		return ""
	}
	if _, versioned := v.V.(float64); !versioned {
		return "" // a flat map of --env values, where "mode" would be an env's name
	}
	return v.Mode
}

func varsJSON(v Vars) string { return versionJSON(v, "") }

// versionJSON is what a version stores beside its spec: its --env and --secret values and
// the mode it was rolled out in ("" for rolling, and for a service's first version).
func versionJSON(v Vars, mode string) string {
	if mode == ModeRolling {
		mode = ""
	}
	if len(v.Secrets) > 0 || mode != "" {
		b, _ := json.Marshal(struct {
			V       int               `json:"v"`
			Envs    map[string]string `json:"envs,omitempty"`
			Secrets map[string]string `json:"secrets,omitempty"`
			Mode    string            `json:"mode,omitempty"`
		}{2, v.Envs, v.Secrets, mode})
		return string(b)
	}
	if v.Envs == nil {
		return "{}"
	}
	b, _ := json.Marshal(v.Envs)
	return string(b)
}

// Create submits a new service; envs are --env values (they fill the spec's null envs).
// Submitting again the spec an existing service runs creates nothing and answers its
// version (created false), so `serve up` can be run again.
func (c *Controller) Create(ctx context.Context, name, text string, envs map[string]string) (version int, created bool, err error) {
	return c.CreateWith(ctx, "", name, text, Vars{Envs: envs})
}

// CreateWith is Create with --secret values too, and key: the client's Idempotency-Key
// ("": none). A create whose key made a version already (its answer was lost, say with the
// leader that wrote it) is answered as it was then, and writes nothing.
func (c *Controller) CreateWith(ctx context.Context, key, name, text string, vars Vars) (version int, created bool, err error) {
	if err := validName(name); err != nil {
		return 0, false, err
	}
	sp, err := c.parseSpec(name, text, vars)
	if err != nil {
		return 0, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, done, err := c.replay(ctx, key, name); err != nil || done {
		return v, done, err
	}
	if s, ok := c.services[name]; ok {
		switch {
		case s.deleting:
			return 0, false, fmt.Errorf("service %q is still shutting down; wait for `serve down` to finish: %w", name, ErrExists)
		case s.runs(sp):
			return s.version, false, nil
		}
		return 0, false, fmt.Errorf("service %q: %w with another spec; use `serve update %s FILE` to change it", name, ErrExists, name)
	}
	if holder, model := c.modelHolder(name, sp); holder != "" {
		return 0, false, modelTaken(name, holder, model)
	}
	now := c.cfg.Now()
	v, err := c.store.PutServiceOnce(ctx, key, name, text, varsJSON(vars), now)
	if err != nil {
		return 0, false, err
	}
	s, err := c.newService(name, v, sp, now)
	if err != nil {
		return 0, false, err
	}
	c.services[name] = s
	c.publish()
	c.kickNow()
	return v, true, nil
}

// Update modes (serve update --mode, SkyServe's): rolling replaces old replicas one by one
// as new ones get ready, both serving meanwhile; blue_green keeps every request on the old
// version until the new one has its target ready, then switches at once.
const (
	ModeRolling   = "rolling"
	ModeBlueGreen = "blue_green"
)

// Update submits a new version of a service: a rolling update.
func (c *Controller) Update(ctx context.Context, name, text string, envs map[string]string) (version int, changed bool, err error) {
	return c.UpdateWith(ctx, "", name, text, Vars{Envs: envs}, ModeRolling)
}

// UpdateWith is Update with --secret values too, an update mode, and the client's
// Idempotency-Key (as CreateWith's).
func (c *Controller) UpdateWith(ctx context.Context, key, name, text string, vars Vars, mode string) (version int, changed bool, err error) {
	switch mode {
	case "", ModeRolling, ModeBlueGreen:
	default:
		return 0, false, fmt.Errorf("%w: update mode %q: want %s or %s", errBadRequest, mode, ModeRolling, ModeBlueGreen)
	}
	sp, err := c.parseSpec(name, text, vars)
	if err != nil {
		return 0, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, done, err := c.replay(ctx, key, name); err != nil || done {
		return v, done, err
	}
	s, ok := c.services[name]
	if !ok || s.deleting {
		return 0, false, fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	if s.runs(sp) {
		// Rolling a new version would replace every replica for nothing, as `sky serve
		// update` does not.
		return s.version, false, nil
	}
	if holder, model := c.modelHolder(name, sp); holder != "" {
		return 0, false, modelTaken(name, holder, model)
	}
	inPlace := s.adaptersOnly(sp) && mode != ModeBlueGreen
	cfg := scaling.ConfigFromSpec(sp)
	// The new version is recorded first: a write that fails changes nothing, here either.
	v, err := c.store.PutServiceOnce(ctx, key, name, text, versionJSON(vars, mode), c.cfg.Now())
	if err != nil {
		return 0, false, err
	}
	s.blueGreen, s.switched = mode == ModeBlueGreen, false
	if s.blueGreen {
		c.event(ctx, name, "", "update", fmt.Sprintf("blue-green update to version %d: the old version serves every request until %d replicas of it are ready", v, max(s.target, 1)))
	}
	if s.decider == nil {
		// The service had failed to load; a spec that loads brings it back.
		d, err := scaling.NewDecider(cfg, c.cfg.Now())
		if err != nil {
			return 0, false, fmt.Errorf("service %s: autoscaling: %w", name, err)
		}
		s.decider = d
		c.event(ctx, name, "", "recover", fmt.Sprintf("version %d loads; the service is managed again", v))
	} else if err := s.decider.SetConfig(cfg); err != nil {
		return 0, false, fmt.Errorf("service %s: autoscaling: %w", name, err)
	}
	s.failed = ""
	s.version, s.specs[v] = v, sp
	// The new version's placement policy; zones cooling after a preemption or a refusal
	// stay avoided. An invalid policy leaves the placer to be rebuilt (and the error
	// reported) on the next tick.
	if s.placer != nil && s.placer.Reconfigure(scaling.PlacementFromSpec(sp, c.cfg.ZoneCooldown)) != nil {
		s.placer = nil
	}
	for _, p := range s.pools {
		if p.placer != nil && p.placer.Reconfigure(scaling.PlacementFromSpec(sp, c.cfg.ZoneCooldown)) != nil {
			p.placer = nil
		}
	}
	s.placement = ""
	s.gmix = nil // rebuilt from the new spec (and what runs) at the next placement
	if inPlace {
		c.adoptReplicas(ctx, s, v)
	}
	c.publish()
	c.kickNow()
	return v, true, nil
}

// adaptersOnly reports whether sp differs from the service's current version only in its
// arbiter.adapters, which routers load and drop at run time on the replicas that run: the
// new version needs no replica of its own (its replicas already allow run-time loads).
func (s *service) adaptersOnly(sp *spec.Service) bool {
	return s.decider != nil && sameButAdapters(s.specs[s.version], sp)
}

// sameButAdapters reports whether a replica started for spec old can serve spec sp: the two
// differ in arbiter.adapters alone, both load adapters at run time, and no adapter kept
// under its name reads other files (a retrained checkpoint at a new path needs replicas
// that load it: the ones running keep the old one under that name).
func sameButAdapters(old, sp *spec.Service) bool {
	if old == nil || sp == nil || !old.Arbiter.LoRA.RuntimeUpdates || !sp.Arbiter.LoRA.RuntimeUpdates {
		return false
	}
	for _, a := range sp.Arbiter.Adapters {
		for _, b := range old.Arbiter.Adapters {
			if a.Name == b.Name && a.Path != b.Path {
				return false
			}
		}
	}
	same := *sp
	same.Arbiter.Adapters = old.Arbiter.Adapters
	return reflect.DeepEqual(&same, old)
}

// sameMerged reports whether an adapter's own replica started for spec old serves spec sp's
// adapter: sp gives it the same merged checkpoint (true for a shared replica, adapter "").
func sameMerged(old, sp *spec.Service, adapter string) bool {
	if adapter == "" {
		return true
	}
	path := sp.Arbiter.MergedPath(adapter)
	return path != "" && path == old.Arbiter.MergedPath(adapter)
}

// adoptReplicas makes version v's own the live replicas whose version's spec differs from
// v's only in its adapters, in memory and in the state (queued behind any write still
// waiting, as every replica write is): an update that changed only adapters rolls no
// replica. A replica of a version still being rolled out stays of it, and is rolled. Caller
// holds c.mu.
func (c *Controller) adoptReplicas(ctx context.Context, s *service, v int) {
	n := 0
	for _, r := range sortedReplicas(s.replicas) {
		if !live(replicas.State(r.row.State)) || r.row.Version == v || !sameButAdapters(s.specs[r.row.Version], s.specs[v]) ||
			!sameMerged(s.specs[r.row.Version], s.specs[v], r.own()) {
			continue
		}
		r.row.Version = v
		c.saveReplica(ctx, r.row, r.row.State, c.cfg.Now())
		n++
	}
	c.event(ctx, s.name, "", "update", fmt.Sprintf("version %d changes only arbiter.adapters: %d replicas keep running as its own, and routers load the adapters added on them as requests come", v, n))
}

// runs reports whether the service's current version is sp: the same service, comments
// and layout of its file aside, with the same envs. A service whose stored spec failed to
// load runs nothing.
func (s *service) runs(sp *spec.Service) bool {
	return s.decider != nil && reflect.DeepEqual(sp, s.specs[s.version])
}

// Delete starts tearing a service down; it is gone once every replica is terminated.
// With purge, a replica whose termination fails is written off instead of retried, so
// the service goes even when its provider cannot be reached or is no longer configured;
// if the instance still runs, the audit finds it by its tags and ends it once it can.
func (c *Controller) Delete(ctx context.Context, name string, purge bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.services[name]
	if !ok {
		return fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	if err := c.store.SetServiceStatus(ctx, name, "deleting", c.cfg.Now()); err != nil {
		return err
	}
	s.deleting = true
	s.purge = s.purge || purge
	c.kickNow()
	return nil
}

// TakeDown drains one replica and terminates it (serve down --replica-id); the service
// replaces it if its target still wants one. With purge, a failed termination writes it
// off. id is a replica id, or a service's replica number (llama-3 or, with service, 3).
func (c *Controller) TakeDown(service, id string, purge bool) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if service != "" {
		if _, ok := c.services[service]; !ok {
			return "", fmt.Errorf("service %q: %w", service, ErrNotFound)
		}
		if _, err := strconv.Atoi(id); err == nil {
			id = service + "-" + id
		}
	}
	for _, s := range c.services {
		r := s.replicas[id]
		if r == nil || (service != "" && s.name != service) {
			continue
		}
		// The next tick (now) drains it, or, if it is launching, the first one after.
		r.down, r.purge = true, r.purge || purge
		c.kickNow()
		return id, nil
	}
	return "", fmt.Errorf("replica %q: %w", id, ErrNotFound)
}

// replay finds the version a write with this Idempotency-Key made (done), for a write to
// service name; "" finds nothing. A key that made a version of another service is a
// client's mistake. Caller holds c.mu, which orders every service write of this leader.
func (c *Controller) replay(ctx context.Context, key, name string) (version int, done bool, err error) {
	if key == "" {
		return 0, false, nil
	}
	if len(key) > 255 {
		return 0, false, fmt.Errorf("%w: Idempotency-Key: want at most 255 characters", errBadRequest)
	}
	svc, v, err := c.store.Request(ctx, key)
	switch {
	case errors.Is(err, state.ErrNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	case svc != name:
		return 0, false, fmt.Errorf("%w: Idempotency-Key %q made version %d of service %s, not a version of %s: send a new key with each write", errBadRequest, key, v, svc, name)
	}
	c.log.Info("a retried write that landed already: answered as the first time", "service", name, "version", v, "key", key)
	return v, true, nil
}

func validName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("%w: service name %q: want 1-63 characters", errBadRequest, name)
	}
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && i > 0
		if !ok {
			return fmt.Errorf("%w: service name %q: use lower-case letters, digits and '-' (not first), e.g. llama-8b", errBadRequest, name)
		}
	}
	return nil
}

// recover rebuilds the runtime from the state file and the providers' own lists: live
// replicas it recorded are adopted and re-probed, half-launched ones are found by their tag
// or written off, and anything running that it does not want is terminated.
func (c *Controller) recover(ctx context.Context) error {
	now := c.cfg.Now()
	svcs, err := c.store.Services(ctx)
	if err != nil {
		return err
	}
	// Built aside and installed under c.mu: a control plane that takes a lease recovers
	// while its API and ready set are served (lease.go).
	loaded := map[string]*service{}
	var unloaded []*service
	for _, sv := range svcs {
		v, err := c.store.GetVersion(ctx, sv.Name, sv.Version)
		if err != nil {
			return err
		}
		sp, err := parseStored(sv.Name, v)
		var s *service
		if err == nil {
			s, err = c.newService(sv.Name, sv.Version, sp, now)
		}
		if err != nil {
			// One service's stored spec that no longer loads (a rule this version added, a
			// provider no longer configured) must not keep the others from starting. Its
			// replicas are kept as they are, unmanaged, until `serve update` gives it a spec
			// that loads or `serve down` removes it.
			s = &service{name: sv.Name, version: sv.Version, specs: map[int]*spec.Service{}, replicas: map[string]*replica{},
				setup: map[int]*sync.Mutex{}, failed: fmt.Sprintf("version %d no longer loads: %v", sv.Version, err)}
			c.log.Error("service not loaded; the others start", "service", sv.Name, "err", err)
			unloaded = append(unloaded, s)
		}
		s.deleting = sv.Status == "deleting"
		// A blue-green update in progress stays one: the switch is worked out again from
		// the replicas (switched at once if the new version is ready or nothing old serves).
		s.blueGreen = storedMode(v.Envs) == ModeBlueGreen
		loaded[sv.Name] = s
	}
	rows, err := c.store.Replicas(ctx, "", false)
	if err != nil {
		return err
	}
	running := map[string]replicas.Instance{} // replica ID → instance
	owner := map[string]replicas.Provider{}
	// A provider that cannot list now (a cluster that does not answer) does not stop the
	// others: its rows stay as they were, and what it runs unrecorded is swept by the
	// audit once it answers.
	unlisted := map[string]error{}
	for name, p := range c.cfg.Providers {
		insts, err := c.listWhenReady(ctx, p)
		if err != nil {
			unlisted[name] = err
			c.log.Error("recover: provider does not list; its replicas are kept as recorded until it does", "provider", name, "err", err)
			continue
		}
		for _, in := range insts {
			running[in.ReplicaID], owner[in.ReplicaID] = in, p
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.services, c.recoveredAt = loaded, now
	c.tenants = tenantBook{} // read again from the store at the next tick
	for _, s := range unloaded {
		c.event(ctx, s.name, "", "error", s.failed+"; fix it with `serve update`, or remove it with `serve down`")
	}
	for name := range unlisted {
		c.unswept[name] = true
	}
	for _, row := range rows {
		inst, found := running[row.ID]
		delete(running, row.ID)
		if err, ok := unlisted[row.Provider]; ok && c.services[row.Service] != nil {
			s := c.services[row.Service]
			r := &replica{row: row, nextProbe: now}
			s.replicas[row.ID] = r
			switch st := replicas.State(row.State); {
			case st == replicas.Pending || st == replicas.Provisioning:
				c.transition(ctx, s, r, replicas.Failed, fmt.Sprintf("its launch did not complete before the control plane stopped, and %s does not answer (%v); terminated once it does", row.Provider, err))
			case live(st) && row.Version == s.version:
				s.target++
			}
			continue
		}
		s := c.services[row.Service]
		if s == nil {
			// A row without its service cannot be reconciled; end it the direct way.
			if found {
				_ = owner[row.ID].Terminate(ctx, inst.Handle)
			}
			row.State, row.Reason, row.EndedAt = string(replicas.Terminated), "its service no longer exists", now
			_ = c.store.SaveReplica(ctx, row, "unknown", now)
			continue
		}
		if row.Version != s.version && s.specs[row.Version] == nil {
			if v, err := c.store.GetVersion(ctx, s.name, row.Version); err == nil {
				if sp, err := parseStored(s.name, v); err == nil {
					s.specs[row.Version] = sp
				}
			}
		}
		r := &replica{row: row, nextProbe: now}
		s.replicas[row.ID] = r
		st := replicas.State(row.State)
		switch {
		case !found && (st == replicas.Pending || st == replicas.Provisioning):
			c.transition(ctx, s, r, replicas.Failed, "its launch did not complete before the control plane stopped")
		case !found && live(st):
			c.transition(ctx, s, r, replicas.Failed, "gone while the control plane was down")
		case found && (st == replicas.Pending || st == replicas.Provisioning):
			c.adopt(r, inst)
			if st == replicas.Pending {
				c.transition(ctx, s, r, replicas.Provisioning, "found running after a restart")
			}
			c.transition(ctx, s, r, replicas.Starting, "adopted after a restart; probing")
		case found && live(st):
			if r.row.Handle == "" {
				c.adopt(r, inst)
			}
			c.event(ctx, s.name, row.ID, "recover", "adopted after a restart; re-probing")
		}
		// Draining, failed and preempted rows finish their way out in reconcile. A drain
		// counts from now: when it began, and what the routers said of it, was the
		// control plane's before this one.
		if replicas.State(r.row.State) == replicas.Draining {
			r.drainSince = now
		}
		if live(replicas.State(r.row.State)) && r.row.Version == s.version {
			s.target++
		}
	}
	for id, inst := range running {
		c.log.Warn("terminating a replica this control plane does not recognise", "replica", id, "handle", inst.Handle)
		c.event(ctx, "", id, "recover", "running but not recognised (no live row): terminated")
		c.endUnknown(ctx, owner[id], inst)
	}
	for _, s := range c.services {
		c.log.Info("recovered service", "service", s.name, "version", s.version, "replicas", len(s.replicas), "target", s.target, "deleting", s.deleting)
	}
	c.relearnModels()
	c.publish()
	return nil
}

// listWhenReady lists a provider's instances, retrying until it answers or ListWait
// passes (a cluster's watches are still syncing at start).
func (c *Controller) listWhenReady(ctx context.Context, p replicas.Provider) ([]replicas.Instance, error) {
	deadline := time.Now().Add(c.cfg.ListWait)
	for {
		insts, err := p.List(ctx)
		if err == nil || time.Now().After(deadline) {
			return insts, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ServiceStatus is one service as the API shows it.
type ServiceStatus struct {
	Name      string    `json:"name"`
	Version   int       `json:"version"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
	Target    int       `json:"target"`
	Decision  string    `json:"decision"`
	// Placement is the placer's last plan (which capacity kinds, which quote, which rule)
	// when the service's provider is a market.
	Placement string `json:"placement,omitempty"`
	// Offers says what placement could not use, while it lasts: a provider that cannot
	// quote (a cluster that does not answer), capacity with no known price.
	Offers string `json:"offers_problem,omitempty"`
	// Failed says why the service's stored spec does not load (status "failed"): its
	// replicas are left as they are until `serve update` or `serve down`.
	Failed   string          `json:"failed,omitempty"`
	Ready    int             `json:"ready"`
	Live     int             `json:"live"`
	Models   []string        `json:"models"`
	Endpoint string          `json:"endpoint"`
	Replicas []state.Replica `json:"replicas"`
	// Cost: replicas are billed from launch to termination, ready or not (a replica loading
	// weights costs as much as one serving).
	DollarsPerHour float64 `json:"dollars_per_hour"`
	Dollars        float64 `json:"dollars"`
	Tokens         float64 `json:"tokens"`
	// DollarsPerMillionTokens is Dollars ÷ Tokens × 1e6 (0 before the first token).
	DollarsPerMillionTokens float64 `json:"dollars_per_million_tokens"`
	// ModelConflicts names each live replica that lists a model another service owns, and
	// says it is not routed to for it (a replica may serve only its own service's models).
	ModelConflicts []string `json:"model_conflicts,omitempty"`
	// Adapters is the use of each LoRA adapter the spec declares, as the state and the
	// routers' reports since the last tick count it, with its share of the service's cost:
	// its tokens at the service's $ per token.
	Adapters []AdapterUse `json:"adapters,omitempty"`
	// PerToken is each live replica's predicted cost per token at the service's SLO, by
	// replica ID: its $/hour over what its GPU's profile sustains for the service's request
	// mix. A replica whose GPU or model has no profile is not in it.
	PerToken map[string]PerToken `json:"per_token,omitempty"`
}

// PerToken is one replica's predicted $ per million tokens at its service's SLO.
type PerToken struct {
	// DollarsPerMillionTokens is 0 where the replica cannot meet the SLO for the mix
	// (TokensPerSecond 0; Why says why).
	DollarsPerMillionTokens float64 `json:"dollars_per_million_tokens"`
	TokensPerSecond         float64 `json:"tokens_per_second"`
	// Why says what the figure is computed from: profile, mix, SLO.
	Why string `json:"why"`
}

// perTokenJob is a live replica whose cost per token status predicts, outside the lock.
type perTokenJob struct {
	service, id, acc, model, what string
	price                         float64
	mix                           []scaling.MixClass
	tpot, ttft                    time.Duration
}

// perToken predicts each job's cost per token into svcs (engine.SustainedRate remembers
// what it computed: a status after the first costs little).
func perToken(svcs []ServiceStatus, jobs []perTokenJob) {
	for _, j := range jobs {
		s := sustainsOn(j.acc, j.model, j.mix, j.what, j.tpot, j.ttft)
		if !s.Known {
			continue
		}
		for i := range svcs {
			if svcs[i].Name != j.service {
				continue
			}
			if svcs[i].PerToken == nil {
				svcs[i].PerToken = map[string]PerToken{}
			}
			pt := PerToken{TokensPerSecond: s.TokensPerSecond, Why: s.Why}
			if s.TokensPerSecond > 0 {
				pt.DollarsPerMillionTokens = scaling.Offer{PricePerHour: j.price, Sustains: s}.PerMTokens()
			}
			svcs[i].PerToken[j.id] = pt
		}
	}
}

// bill adds what a service's replicas (ended ones too) have cost up to now.
func bill(st *ServiceStatus, rows []state.Replica, now time.Time) {
	for _, r := range rows {
		if r.EndedAt.IsZero() {
			st.DollarsPerHour += r.PricePerHour
		}
		st.Dollars += r.PricePerHour * billedSeconds(r, now) / 3600
	}
	if st.Tokens > 0 {
		st.DollarsPerMillionTokens = st.Dollars / st.Tokens * 1e6
	}
}

// finite is x, or 0 for a total an older version let overflow to ±Inf or NaN: status must
// render, and the counts since are still right.
func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// Status returns every service ("" ) or one, with the replicas the control plane manages.
func (c *Controller) Status(ctx context.Context, name string) ([]ServiceStatus, error) {
	return c.status(ctx, name, false)
}

// status is Status, with every ended replica of the state file too when withEnded.
func (c *Controller) status(ctx context.Context, name string, withEnded bool) ([]ServiceStatus, error) {
	rows, err := c.store.Services(ctx)
	if err != nil {
		return nil, err
	}
	all, err := c.store.Replicas(ctx, name, true)
	if err != nil {
		return nil, err
	}
	uses, err := c.store.AdapterUses(ctx)
	if err != nil {
		return nil, err
	}
	now := c.cfg.Now()
	var jobs []perTokenJob
	out, err := func() ([]ServiceStatus, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.statusLocked(rows, all, uses, name, now, withEnded, &jobs)
	}()
	if err != nil {
		return nil, err
	}
	perToken(out, jobs)
	return out, nil
}

// statusLocked builds status from the stored rows, and lists the live replicas whose cost
// per token is to be predicted. Caller holds c.mu.
func (c *Controller) statusLocked(rows []state.Service, all []state.Replica, uses map[string]map[string]state.AdapterUse, name string, now time.Time, withEnded bool, jobs *[]perTokenJob) ([]ServiceStatus, error) {
	var out []ServiceStatus
	for _, row := range rows {
		if name != "" && row.Name != name {
			continue
		}
		s := c.services[row.Name]
		if s == nil {
			continue
		}
		st := ServiceStatus{Name: s.name, Version: s.version, CreatedAt: row.CreatedAt, Target: s.target, Decision: s.decision.Reason,
			Placement: s.placement, Offers: s.quoteErr, Models: s.models(), Endpoint: c.cfg.Endpoint, Replicas: []state.Replica{}, Tokens: finite(row.Tokens) + s.tokens}
		var mine []state.Replica
		for _, r := range all {
			if r.Service == s.name {
				mine = append(mine, r)
			}
		}
		bill(&st, mine, now)
		st.Adapters = s.adapterUse(uses[s.name], st.DollarsPerMillionTokens)
		for _, r := range sortedReplicas(s.replicas) {
			st.Replicas = append(st.Replicas, r.row)
			if r.conflict != "" && live(replicas.State(r.row.State)) {
				st.ModelConflicts = append(st.ModelConflicts, r.conflict)
			}
			if replicas.State(r.row.State) == replicas.Ready {
				st.Ready++
			}
			if live(replicas.State(r.row.State)) {
				st.Live++
				if sp := s.spec(); sp != nil && r.row.Accelerator != "" {
					if model := serviceModel(sp); model != "" {
						observed, n := s.mix.classes(now)
						mix, what := sizingMix(sp, observed, n)
						tpot, ttft := sloTargets(sp)
						*jobs = append(*jobs, perTokenJob{service: s.name, id: r.row.ID, acc: r.row.Accelerator, model: model, what: what,
							price: r.row.PricePerHour, mix: mix, tpot: tpot, ttft: ttft})
					}
				}
			}
		}
		if withEnded {
			for _, r := range mine {
				if s.replicas[r.ID] == nil {
					st.Replicas = append(st.Replicas, r)
				}
			}
		}
		switch {
		case s.deleting:
			st.Status = "shutting_down"
		case s.failed != "":
			st.Status, st.Failed = "failed", s.failed
		case st.Ready > 0:
			st.Status = "ready"
		case s.target == 0:
			st.Status = "scaled_to_zero"
		case st.Live == 0 && s.unplaced:
			// Nothing runs and nothing could be launched: not "starting".
			st.Status = "waiting_for_capacity"
		default:
			st.Status = "starting"
		}
		out = append(out, st)
	}
	if name != "" && len(out) == 0 {
		return nil, fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	return out, nil
}
