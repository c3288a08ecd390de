// Package runpodfake is a stateful stand-in for RunPod's GraphQL API, for tests: the
// runpod provider talks to it over real HTTP on loopback. It follows the published schema
// (https://graphql-spec.runpod.io/: podFindAndDeployOnDemand, podRentInterruptable,
// podTerminate, pod, myself.pods, gpuTypes.lowestPrice) without a GraphQL engine: it finds
// the operation by its root field and reads its input from the request's variables, and
// answers {"data": …} or, as RunPod does for refusals, HTTP 200 with {"errors": [...]}.
//
// A pod "runs" by executing its start command (dockerArgs) with sh -c as a local process,
// with the pod's env, its own loopback address in ARBITER_HOST (reported as the pod's
// public IP, its port mapped to itself) and its own folder in ARBITER_DIR. Faults: GPU
// types out of stock, capacity refused per GPU type and market, throttling (HTTP 429),
// interruptions (an interruptible pod stopped: EXITED).
package runpodfake

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// GPU is one GPU type's price and stock, what gpuTypes.lowestPrice answers.
type GPU struct {
	ID, DisplayName      string
	MinimumBidPrice      float64 // per GPU-hour, interruptible
	UninterruptablePrice float64 // per GPU-hour, on-demand
	StockStatus          string  // High, Medium, Low; "" for none
}

// Config shapes the fake account.
type Config struct {
	APIKey     string
	GPUs       []GPU
	Dir        string
	Env        []string      // added to every pod's process (PATH to the test's binaries)
	PendingFor time.Duration // before a pod's command runs and its port is mapped
	// Network is the first three octets of the pods' loopback addresses; default: a random
	// 127.x.y, so fakes in tests that run at once do not hand out the same address.
	Network string
}

// Server is the fake endpoint; serve it with httptest.NewServer(s).
type Server struct {
	cfg Config

	mu        sync.Mutex
	seq       int
	pods      map[string]*pod
	refuse    map[string]bool // gpu id|market
	throttleN int
	calls     map[string]int
	inputs    []map[string]any
}

type pod struct {
	id, name, status, gpu string
	spot                  bool
	cost                  float64
	env                   []string
	ip                    string
	port                  int
	running               bool // its command started and its port is mapped
	cmd                   *exec.Cmd
	exited                chan struct{}
}

// New returns a fake account.
func New(cfg Config) *Server {
	if cfg.Network == "" {
		cfg.Network = fmt.Sprintf("127.%d.%d", 100+rand.IntN(150), rand.IntN(256))
	}
	return &Server{cfg: cfg, pods: map[string]*pod{}, refuse: map[string]bool{}, calls: map[string]int{}}
}

// Refuse makes renting gpu in market ("spot" or "on_demand") fail as RunPod does when no
// machine has it; false lifts it.
func (s *Server) Refuse(gpu, market string, refuse bool) {
	s.mu.Lock()
	s.refuse[gpu+"|"+market] = refuse
	s.mu.Unlock()
}

// Throttle makes the next n calls answer HTTP 429.
func (s *Server) Throttle(n int) {
	s.mu.Lock()
	s.throttleN = n
	s.mu.Unlock()
}

// Calls is how many times a root field was asked for.
func (s *Server) Calls(field string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[field]
}

// Inputs are the input variables of every mutation, in order.
func (s *Server) Inputs() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.inputs)
}

// Live lists the pods not terminated, by id, with their env.
func (s *Server) Live() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for id, p := range s.pods {
		if p.status != "TERMINATED" {
			out[id] = p.env
		}
	}
	return out
}

// Interrupt stops an interruptible pod as RunPod does when it is outbid or its host
// reclaimed: its process is killed and it stays EXITED (billed for its disk) until
// terminated.
func (s *Server) Interrupt(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pods[id]
	if p == nil || !p.spot {
		return fmt.Errorf("runpodfake: %s is not an interruptible pod", id)
	}
	p.status = "EXITED"
	s.kill(p)
	return nil
}

// Close kills every pod's process.
func (s *Server) Close() {
	s.mu.Lock()
	var waits []chan struct{}
	for _, p := range s.pods {
		if p.cmd != nil {
			s.kill(p)
			waits = append(waits, p.exited)
		}
	}
	s.mu.Unlock()
	for _, w := range waits {
		<-w
	}
}

func (s *Server) kill(p *pod) {
	p.running = false
	if p.cmd != nil && p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

var rootField = regexp.MustCompile(`^\s*(?:query|mutation)\s*\w*\s*(?:\([^)]*\))?\s*\{\s*(\w+)`)

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer "+s.cfg.APIKey {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"errors":[{"message":"Unauthorized"}]}`)
		return
	}
	var req struct {
		Query     string         `json:"query"`
		Variables map[string]any `json:"variables"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	m := rootField.FindStringSubmatch(req.Query)
	if m == nil {
		writeErr(w, "Syntax Error: could not find an operation")
		return
	}
	field := m[1]
	s.mu.Lock()
	s.calls[field]++
	throttled := s.throttleN > 0
	if throttled {
		s.throttleN--
	}
	s.mu.Unlock()
	if throttled {
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"errors":[{"message":"Too many requests"}]}`)
		return
	}
	input, _ := req.Variables["input"].(map[string]any)
	var data any
	var msg string
	switch field {
	case "podFindAndDeployOnDemand", "podRentInterruptable":
		data, msg = s.create(field, input)
	case "podTerminate":
		msg = s.terminate(input)
	case "pod":
		data = s.get(input)
	case "myself":
		data = s.list()
	case "gpuTypes":
		data = s.gpuTypes()
	default:
		msg = `Cannot query field "` + field + `" on type "Query".`
	}
	if msg != "" {
		writeErr(w, msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{field: data}})
}

func writeErr(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"message": msg}}, "data": nil})
}

func (s *Server) gpu(id string) (GPU, bool) {
	for _, g := range s.cfg.GPUs {
		if g.ID == id {
			return g, true
		}
	}
	return GPU{}, false
}

func (s *Server) create(field string, in map[string]any) (any, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inputs = append(s.inputs, in)
	gpuID, _ := in["gpuTypeId"].(string)
	image, _ := in["imageName"].(string)
	count, _ := in["gpuCount"].(float64)
	if gpuID == "" || image == "" || count < 1 {
		return nil, "gpuTypeId, imageName and gpuCount are required"
	}
	g, ok := s.gpu(gpuID)
	if !ok {
		return nil, "GPU type " + gpuID + " does not exist"
	}
	spot := field == "podRentInterruptable"
	market, price := "on_demand", g.UninterruptablePrice
	if spot {
		market = "spot"
		bid, _ := in["bidPerGpu"].(float64)
		if bid < g.MinimumBidPrice {
			return nil, fmt.Sprintf("Your bid of %.3f is below the minimum bid price of %.3f.", bid, g.MinimumBidPrice)
		}
		price = bid
	}
	if s.refuse[gpuID+"|"+market] || g.StockStatus == "" {
		return nil, "There are no longer any instances available with the requested specifications. Please refresh and try again."
	}
	var env []string
	list, _ := in["env"].([]any)
	for _, e := range list {
		kv, _ := e.(map[string]any)
		env = append(env, fmt.Sprint(kv["key"])+"="+fmt.Sprint(kv["value"]))
	}
	port := 0
	if ports, _ := in["ports"].(string); ports != "" {
		port, _ = strconv.Atoi(strings.TrimSuffix(strings.Split(ports, ",")[0], "/tcp"))
	}
	s.seq++
	p := &pod{id: fmt.Sprintf("fake%010d", s.seq), name: fmt.Sprint(in["name"]), status: "RUNNING", gpu: gpuID, spot: spot,
		cost: price * count, env: env, port: port, ip: fmt.Sprintf("%s.%d", s.cfg.Network, 1+s.seq%250), exited: make(chan struct{})}
	s.pods[p.id] = p
	args, _ := in["dockerArgs"].(string)
	time.AfterFunc(s.cfg.PendingFor, func() { s.start(p, args) })
	return s.podJSON(p), ""
}

// start runs a pod's start command as its container would: sh -c with its env.
func (s *Server) start(p *pod, args string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.status != "RUNNING" {
		return
	}
	dir := filepath.Join(s.cfg.Dir, p.id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	out, err := os.Create(filepath.Join(dir, "container.log"))
	if err != nil {
		return
	}
	cmd := exec.Command("sh", "-c", args)
	cmd.Dir = dir
	cmd.Env = append(append(append(os.Environ(), s.cfg.Env...), p.env...), "ARBITER_HOST="+p.ip, "ARBITER_DIR="+dir)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return
	}
	p.cmd, p.running = cmd, true
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(p.exited)
	}()
}

func (s *Server) terminate(in map[string]any) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pods[fmt.Sprint(in["podId"])]
	if p == nil {
		return "pod not found"
	}
	p.status = "TERMINATED"
	s.kill(p)
	return ""
}

func (s *Server) get(in map[string]any) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pods[fmt.Sprint(in["podId"])]
	if p == nil || p.status == "TERMINATED" {
		return nil // RunPod answers null for a pod it no longer has
	}
	return s.podJSON(p)
}

func (s *Server) list() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pods []any
	for _, id := range slices.Sorted(maps.Keys(s.pods)) {
		if p := s.pods[id]; p.status != "TERMINATED" {
			pods = append(pods, s.podJSON(p))
		}
	}
	return map[string]any{"pods": pods}
}

func (s *Server) podJSON(p *pod) map[string]any {
	out := map[string]any{"id": p.id, "name": p.name, "desiredStatus": p.status, "costPerHr": p.cost, "env": p.env, "runtime": nil}
	if p.running {
		out["runtime"] = map[string]any{"uptimeInSeconds": 1, "ports": []map[string]any{
			{"ip": p.ip, "isIpPublic": true, "privatePort": p.port, "publicPort": p.port, "type": "tcp"}}}
	}
	return out
}

func (s *Server) gpuTypes() any {
	var out []map[string]any
	for _, g := range s.cfg.GPUs {
		stock := any(g.StockStatus)
		if g.StockStatus == "" {
			stock = nil
		}
		out = append(out, map[string]any{"id": g.ID, "displayName": g.DisplayName, "memoryInGb": 80,
			"lowestPrice": map[string]any{"minimumBidPrice": g.MinimumBidPrice, "uninterruptablePrice": g.UninterruptablePrice, "stockStatus": stock}})
	}
	return out
}
