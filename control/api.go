package control

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/state"
)

// maxBody bounds API request bodies (a spec, a load report).
const maxBody = 4 << 20

// LogSource is a provider that can show a replica's output (the local provider's files).
type LogSource interface {
	LogPath(replicaID string) string
}

// LogFetcher is a provider that reads a replica's output where it runs (a pod's logs
// through the Kubernetes API), from a byte offset, at most 1 MiB at a time.
type LogFetcher interface {
	ReplicaLogs(ctx context.Context, replicaID string, offset int64) ([]byte, error)
}

// Handler is the control plane's HTTP API, for the CLI and for routers.
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, map[string]bool{"ok": true}) })
	mux.HandleFunc("GET /v1/services", c.auth(c.listServices))
	mux.HandleFunc("POST /v1/services", c.auth(c.createService))
	mux.HandleFunc("GET /v1/services/{name}", c.auth(c.getService))
	mux.HandleFunc("PUT /v1/services/{name}", c.auth(c.updateService))
	mux.HandleFunc("DELETE /v1/services/{name}", c.auth(c.deleteService))
	mux.HandleFunc("GET /v1/events", c.auth(c.events))
	mux.HandleFunc("GET /v1/tenants", c.auth(c.tenantsSpend))
	mux.HandleFunc("GET /v1/logs/{replica}", c.auth(c.logs))
	mux.HandleFunc("GET /v1/readyset", c.auth(c.readySet))
	mux.HandleFunc("POST /v1/load", c.auth(c.load))
	mux.HandleFunc("POST /v1/wake", c.auth(c.wake))
	mux.HandleFunc("POST /v1/validate", c.auth(c.validate))
	mux.HandleFunc("POST /v1/preview", c.auth(c.preview))
	mux.HandleFunc("POST /v1/replicas/{id}/preempt", c.auth(c.preempt))
	mux.HandleFunc("POST /v1/replicas/{id}/down", c.auth(c.takeDown))
	return c.forwardWrites(mux)
}

// APIError is the API's error body.
type APIError struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	var sl *spec.ErrorList
	switch {
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, ErrExists), errors.Is(err, ErrModelTaken):
		code = http.StatusConflict
	case errors.As(err, &sl), errors.Is(err, errBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, errTooLarge):
		code = http.StatusRequestEntityTooLarge
	}
	if errors.Is(err, state.ErrNotLeader) || errors.Is(err, state.ErrFenced) {
		// Another control plane leads: nothing changed here, and it takes the write.
		w.Header().Set("Retry-After", "5")
		code = http.StatusServiceUnavailable
	}
	if why := state.Unavailable(err); why != "" && code == http.StatusInternalServerError {
		// Nothing changed and a retry may well succeed: say so, and why.
		w.Header().Set("Retry-After", "5")
		code = http.StatusServiceUnavailable
		err = fmt.Errorf("%s: %w", why, err)
	}
	writeJSON(w, code, APIError{Error: err.Error()})
}

var (
	errBadRequest = errors.New("bad request")
	errTooLarge   = errors.New("request too large")
)

func (c *Controller) auth(h http.HandlerFunc) http.HandlerFunc {
	want := []byte("Bearer " + c.cfg.Token)
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeJSON(w, http.StatusUnauthorized, APIError{Error: "missing or wrong API token (Authorization: Bearer <token>)"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		h(w, r)
	}
}

func decode(r *http.Request, v any) error {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		var big *http.MaxBytesError
		if errors.As(err, &big) {
			return fmt.Errorf("%w: the request body is over %d bytes", errTooLarge, big.Limit)
		}
		return fmt.Errorf("%w: request body: %v", errBadRequest, err)
	}
	return nil
}

// idempotencyHeader names a write (IETF draft-ietf-httpapi-idempotency-key-header): `serve`
// sends a new key with each write and the same one with each retry of it, so that a write
// retried through a failover lands once. The API remembers the keys of service writes (up,
// update) for a day; its other writes are idempotent as they are.
const idempotencyHeader = "Idempotency-Key"

// SubmitRequest creates or updates a service.
type SubmitRequest struct {
	Name string `json:"name"`
	Spec string `json:"spec"` // the service.yaml text
	// Envs are --env values: they add to the spec's envs and fill its null ones.
	Envs map[string]string `json:"envs,omitempty"`
	// Secrets are --secret values, the same for the spec's secrets; never logged or shown.
	Secrets map[string]string `json:"secrets,omitempty"`
	// Mode is how an update replaces the old version: rolling (default) or blue_green.
	Mode string `json:"mode,omitempty"`
}

func (r SubmitRequest) vars() Vars { return Vars{Envs: r.Envs, Secrets: r.Secrets} }

// SubmitResponse answers a submission.
type SubmitResponse struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	// Unchanged: the spec is the one the service's current version runs (a create of an
	// existing service, or an update); nothing was stored and nothing rolls.
	Unchanged bool `json:"unchanged,omitempty"`
}

func (c *Controller) createService(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	v, created, err := c.CreateWith(r.Context(), r.Header.Get(idempotencyHeader), req.Name, req.Spec, req.vars())
	switch {
	case err != nil:
		writeErr(w, err)
	case created:
		writeJSON(w, http.StatusCreated, SubmitResponse{Name: req.Name, Version: v})
	default:
		writeJSON(w, http.StatusOK, SubmitResponse{Name: req.Name, Version: v, Unchanged: true})
	}
}

func (c *Controller) updateService(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	name := r.PathValue("name")
	v, changed, err := c.UpdateWith(r.Context(), r.Header.Get(idempotencyHeader), name, req.Spec, req.vars(), req.Mode)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, SubmitResponse{Name: name, Version: v, Unchanged: !changed})
}

func (c *Controller) deleteService(w http.ResponseWriter, r *http.Request) {
	if err := c.Delete(r.Context(), r.PathValue("name"), r.URL.Query().Get("purge") == "1"); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "shutting_down"})
}

// withEnded reads ?all=1: every ended replica too (`serve status -a`).
func withEnded(r *http.Request) bool { return r.URL.Query().Get("all") == "1" }

func (c *Controller) listServices(w http.ResponseWriter, r *http.Request) {
	c.fresh(r.Context())
	st, err := c.status(r.Context(), "", withEnded(r))
	if err != nil {
		writeErr(w, err)
		return
	}
	if st == nil {
		st = []ServiceStatus{}
	}
	writeJSON(w, http.StatusOK, st)
}

func (c *Controller) getService(w http.ResponseWriter, r *http.Request) {
	c.fresh(r.Context())
	st, err := c.status(r.Context(), r.PathValue("name"), withEnded(r))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st[0])
}

func (c *Controller) validate(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if _, err := c.parseSpec(req.Name, req.Spec, req.vars()); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// preview answers where a spec's first replicas would run and at what price.
func (c *Controller) preview(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	pv, err := c.Preview(r.Context(), req.Name, req.Spec, req.vars())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, pv)
}

func (c *Controller) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, _ := strconv.ParseInt(q.Get("after"), 10, 64)
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit <= 0 || limit > 10000 {
		limit = 1000
	}
	ev, err := c.store.Events(r.Context(), q.Get("service"), q.Get("replica"), after, limit)
	if err != nil {
		writeErr(w, err)
		return
	}
	if ev == nil {
		writeJSON(w, http.StatusOK, []struct{}{})
		return
	}
	writeJSON(w, http.StatusOK, ev)
}

// logs serves a replica's output from offset (?offset=N); X-Log-Offset says where the next
// read starts, so `serve logs --follow` polls without re-reading. Output a provider keeps
// on the host of the control plane that launched the replica (the local provider's files)
// is read through that control plane when it is not here (issue 46 §4).
func (c *Controller) logs(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("replica")
	row, ok := c.replicaRow(r.Context(), id)
	if !ok {
		writeErr(w, fmt.Errorf("replica %q: %w", id, ErrNotFound))
		return
	}
	p, err := c.provider(row.Provider)
	if err != nil {
		writeErr(w, err)
		return
	}
	off, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	off = max(off, 0)
	if lf, ok := p.(LogFetcher); ok {
		b, err := lf.ReplicaLogs(r.Context(), id, off)
		if err != nil {
			writeErr(w, fmt.Errorf("replica %s log: %w", id, err))
			return
		}
		writeLog(w, off, b)
		return
	}
	src, ok := p.(LogSource)
	if !ok {
		writeErr(w, fmt.Errorf("%w: provider %s keeps no logs here", errBadRequest, row.Provider))
		return
	}
	f, err := os.Open(src.LogPath(id))
	if errors.Is(err, os.ErrNotExist) && c.cfg.Lease != nil && row.Launcher != "" && row.Launcher != c.store.Advertised() && r.Header.Get(forwardedHeader) == "" {
		c.logsFrom(w, r, row)
		return
	}
	if err != nil {
		writeErr(w, fmt.Errorf("replica %s log: %w", id, ErrNotFound))
		return
	}
	defer f.Close()
	if off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			writeErr(w, err)
			return
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeLog(w, off, b)
}

func writeLog(w http.ResponseWriter, off int64, b []byte) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Log-Offset", strconv.FormatInt(off+int64(len(b)), 10))
	_, _ = w.Write(b)
}

// replicaRow is a replica's row: the one this control plane follows, else the store's
// (an ended replica's too).
func (c *Controller) replicaRow(ctx context.Context, id string) (state.Replica, bool) {
	c.mu.Lock()
	_, rep := c.replicaByID(id)
	var row state.Replica
	if rep != nil {
		row = rep.row
	}
	c.mu.Unlock()
	if rep != nil && (row.Launcher != "" || c.cfg.Lease == nil) {
		return row, true
	}
	// The store's row says who launched it, whatever this control plane's copy holds.
	rows, err := c.store.Replicas(ctx, "", true)
	if err == nil {
		for _, r := range rows {
			if r.ID == id {
				return r, true
			}
		}
	}
	return row, rep != nil
}

// logsFrom reads a replica's output through the control plane that launched it, where
// the provider keeps it (the local provider's files on that host); if that one does not
// answer, the error says which it is and where its files are.
func (c *Controller) logsFrom(w http.ResponseWriter, r *http.Request, row state.Replica) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(row.Launcher, "/")+r.URL.RequestURI(), nil)
	if err != nil {
		writeErr(w, fmt.Errorf("replica %s log: launcher %q: %w", row.ID, row.Launcher, err))
		return
	}
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	req.Header.Set(forwardedHeader, c.holder())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// 502, not 503: no other control plane has the files, so the CLI does not wait
		// for one as it would through a failover.
		writeJSON(w, http.StatusBadGateway, APIError{Error: fmt.Sprintf(
			"replica %s's output is kept on the host of the control plane that launched it, which answers at %s (in the logs/ folder of its --home), and it did not answer: %v",
			row.ID, row.Launcher, err)})
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "X-Log-Offset", "Retry-After"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, 2<<20))
}

// holder names this control plane (its lease's holder; "" without a lease).
func (c *Controller) holder() string {
	if c.cfg.Lease == nil {
		return ""
	}
	return c.cfg.Lease.Holder()
}

// readySet long-polls: it answers at once when the caller's revision (?after=N) is not the
// current one, else when the set changes or after ?wait (at most 60 s).
func (c *Controller) readySet(w http.ResponseWriter, r *http.Request) {
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	wait, err := time.ParseDuration(r.URL.Query().Get("wait"))
	if err != nil || wait < 0 {
		wait = 0
	}
	wait = min(wait, 60*time.Second)
	// A router that moves here from a leader that died knows a later set than this
	// standby's last periodic read may (a replica ready since): read the store first, or
	// the router would drop that replica (issue 46: seen at a 15 s lease).
	c.fresh(r.Context())
	set, changed := c.ReadySet()
	if set.Revision == after && wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-changed:
			set, _ = c.ReadySet()
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, http.StatusOK, set)
}

func (c *Controller) load(w http.ResponseWriter, r *http.Request) {
	var rep fleet.LoadReport
	if err := decode(r, &rep); err != nil {
		writeErr(w, err)
		return
	}
	if err := rep.Validate(); err != nil {
		writeErr(w, fmt.Errorf("%w: load report: %v", errBadRequest, err))
		return
	}
	if !c.leading() {
		// A standby decides nothing: taken here, the counts would be lost. Refused, the
		// router sends them to another control plane (the leader).
		writeErr(w, state.ErrNotLeader)
		return
	}
	c.Report(rep)
	// The answer carries every tenant's spend, this report's included, for the budgets.
	c.mu.Lock()
	ans := c.tenants.answer(c.cfg.Now())
	c.mu.Unlock()
	writeJSON(w, http.StatusOK, ans)
}

func (c *Controller) wake(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
	}
	if err := decode(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if !c.leading() {
		writeErr(w, state.ErrNotLeader) // as load: the leader wakes the service
		return
	}
	if err := c.Wake(req.Model); err != nil {
		writeErr(w, fmt.Errorf("%w", ErrNotFound))
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// takeDown drains and terminates one replica: ?service=NAME lets the id be the replica's
// number in that service, ?purge=1 writes it off if its termination fails.
func (c *Controller) takeDown(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id, err := c.TakeDown(q.Get("service"), r.PathValue("id"), q.Get("purge") == "1")
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "draining", "replica": id})
}

// preempt injects a preemption notice (?notice=30s, default 30 s as GCP gives).
func (c *Controller) preempt(w http.ResponseWriter, r *http.Request) {
	warn := 30 * time.Second
	if v := r.URL.Query().Get("notice"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Hour {
			writeErr(w, fmt.Errorf("%w: notice %q: want a duration up to 1h, e.g. 30s", errBadRequest, v))
			return
		}
		warn = d
	}
	if err := c.Preempt(r.PathValue("id"), warn); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "notice sent"})
}
