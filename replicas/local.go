package replicas

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

// Environment variables the local provider sets on every replica. The owner and replica
// tags are how List finds replicas after a control-plane crash: they play the part of a
// cloud's instance tags.
const (
	EnvOwner     = "ARBITER_OWNER"
	EnvReplicaID = "ARBITER_REPLICA_ID"
	EnvPort      = "PORT"
	// EnvProvider names the provider that launched the process (local, or sim, which runs
	// its replicas as local processes too); missing means local.
	EnvProvider = "ARBITER_PROVIDER"
	// EnvAccelerator is the GPU placement chose for the replica, as the catalogs name it
	// (empty where none was chosen): a run script can start the right engine for it, e.g.
	// replicasim -gpu $ARBITER_ACCELERATOR.
	EnvAccelerator = "ARBITER_ACCELERATOR"
)

// LocalConfig configures the local provider.
type LocalConfig struct {
	// Name is the provider's name ("local" when empty); the sim provider runs its replicas
	// through a Local of its own name, so each lists only its own.
	Name string
	// Owner identifies this control plane (e.g. derived from its state file); replicas of
	// another owner are never listed or touched.
	Owner string
	// LogDir receives one log file per replica and per setup run.
	LogDir string
	// ExtraPath is prepended to PATH for setup and run (the directory of Arbiter's own
	// binaries, so a run: of "replicasim" finds the simulator).
	ExtraPath string
	// FallbackPath is appended to PATH: commands found there only when the machine has
	// none of its own (a vllm that replicasim stands in for, where no vLLM is installed).
	FallbackPath string
	Capacity     fleet.Capacity
	PricePerHour float64
	Region, Zone string
	// Grace is how long a replica has between SIGTERM and SIGKILL.
	Grace time.Duration
	Log   *slog.Logger
	// MaxReplicas is the most replicas this provider runs at once; a launch beyond it is
	// refused (ErrNoCapacity). Default: DefaultLocalMaxReplicas.
	MaxReplicas int
}

// DefaultLocalMaxReplicas is four replicas per CPU, at least 16: room for a simulator
// fleet and a rolling update, not for a typo's thousand processes.
func DefaultLocalMaxReplicas() int { return max(16, 4*runtime.NumCPU()) }

// Local runs replicas as child process groups on this machine, each on a free loopback port.
type Local struct {
	cfg     LocalConfig
	notices chan Notice
	// launching serialises the capacity check with the start it allows.
	launching sync.Mutex
}

// NewLocal returns the local provider.
func NewLocal(cfg LocalConfig) (*Local, error) {
	if cfg.Owner == "" || cfg.LogDir == "" {
		return nil, errors.New("local provider: owner and log dir are required")
	}
	if err := os.MkdirAll(cfg.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.Capacity == "" {
		cfg.Capacity = fleet.Reserved
	}
	if cfg.Name == "" {
		cfg.Name = "local"
	}
	if cfg.MaxReplicas <= 0 {
		cfg.MaxReplicas = DefaultLocalMaxReplicas()
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Local{cfg: cfg, notices: make(chan Notice, 16)}, nil
}

// Name implements Provider.
func (l *Local) Name() string { return l.cfg.Name }

// LogPath is where a replica's output goes.
func (l *Local) LogPath(replicaID string) string {
	return filepath.Join(l.cfg.LogDir, replicaID+".log")
}

func (l *Local) env(envs map[string]string, extra ...string) []string {
	env := os.Environ()
	if l.cfg.ExtraPath != "" || l.cfg.FallbackPath != "" {
		path := os.Getenv("PATH")
		if l.cfg.ExtraPath != "" {
			path = l.cfg.ExtraPath + string(os.PathListSeparator) + path
		}
		if l.cfg.FallbackPath != "" {
			path += string(os.PathListSeparator) + l.cfg.FallbackPath
		}
		env = append(env, "PATH="+path)
	}
	keys := make([]string, 0, len(envs))
	for k := range envs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+envs[k])
	}
	return append(env, extra...)
}

// Setup implements Provider: runs the setup command to completion.
func (l *Local) Setup(ctx context.Context, service string, version int, setup, workdir string, envs map[string]string) error {
	if strings.TrimSpace(setup) == "" {
		return nil
	}
	logPath := filepath.Join(l.cfg.LogDir, fmt.Sprintf("%s-v%d-setup.log", service, version))
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("setup %s: %w", service, err)
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "bash", "-c", setup)
	cmd.Dir, cmd.Stdout, cmd.Stderr = workdir, f, f
	cmd.Env = l.env(envs)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("setup of %s v%d failed (%w); its output is in %s", service, version, err, logPath)
	}
	return nil
}

// portFlag matches a run: command's hard-coded port flag (vllm serve --port 8000), so that
// the same command can run several times on one machine.
func portFlag(port int) *regexp.Regexp {
	return regexp.MustCompile(`(--port[= ])` + strconv.Itoa(port) + `\b`)
}

// MaxReplicas implements Bounded.
func (l *Local) MaxReplicas() int { return l.cfg.MaxReplicas }

// Launch implements Provider. A launch beyond MaxReplicas is refused for want of capacity.
func (l *Local) Launch(ctx context.Context, spec LaunchSpec) (Instance, error) {
	l.launching.Lock()
	defer l.launching.Unlock()
	running, err := l.List(ctx)
	if err != nil {
		return Instance{}, fmt.Errorf("launch %s: %w", spec.ReplicaID, err)
	}
	// The bound counts processes: each node of a multi-node replica is one.
	used := 0
	for _, r := range running {
		used += strings.Count(r.Handle, nodeSep) + 1
	}
	if used+spec.Nodes() > l.cfg.MaxReplicas {
		return Instance{}, fmt.Errorf("launch %s: this machine already runs %d replica nodes and this replica needs %d, over the %s provider's limit of %d (serve daemon --local-max-replicas): %w",
			spec.ReplicaID, used, spec.Nodes(), l.cfg.Name, l.cfg.MaxReplicas, ErrNoCapacity)
	}
	if err := linkMounts(spec.FileMounts); err != nil {
		return Instance{}, fmt.Errorf("launch %s: %w", spec.ReplicaID, err)
	}
	f, err := os.OpenFile(l.LogPath(spec.ReplicaID), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return Instance{}, fmt.Errorf("launch %s: %w", spec.ReplicaID, err)
	}
	defer f.Close()
	n := spec.Nodes()
	ports := make([]int, n)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return Instance{}, fmt.Errorf("launch %s: %w", spec.ReplicaID, err)
		}
	}
	seq := spec.ReplicaID[strings.LastIndexByte(spec.ReplicaID, '-')+1:]
	lb := l.labels(spec)
	// Every node is on this machine: SKYPILOT_NODE_IPS lists its loopback address once per
	// node, head first, as SkyPilot lists a cluster's IPs.
	ips := strings.TrimSuffix(strings.Repeat("127.0.0.1\n", n), "\n")
	gpus := strconv.Itoa(max(1, spec.AcceleratorCount))
	nodes := make([]string, 0, n)
	headPID := 0
	for rank := range n {
		run := spec.Run
		if spec.Port != 0 {
			run = portFlag(spec.Port).ReplaceAllString(run, "${1}"+strconv.Itoa(ports[rank]))
		}
		cmd := exec.Command("bash", "-c", run)
		cmd.Dir, cmd.Stdout, cmd.Stderr = spec.Workdir, f, f
		// The labels ride in the environment too, so List (after a control-plane restart)
		// reports the replica as it was launched, not with the provider's defaults.
		cmd.Env = l.env(spec.Envs,
			EnvOwner+"="+l.cfg.Owner, EnvProvider+"="+l.cfg.Name, EnvReplicaID+"="+spec.ReplicaID, EnvPort+"="+strconv.Itoa(ports[rank]),
			envCapacity+"="+string(lb.capacity), envRegion+"="+lb.region, envZone+"="+lb.zone,
			envPrice+"="+strconv.FormatFloat(lb.price, 'g', -1, 64), envNodes+"="+strconv.Itoa(n), envNodeRank+"="+strconv.Itoa(rank),
			EnvAccelerator+"="+spec.Accelerator,
			"SKYPILOT_SERVE_REPLICA_ID="+seq, "SKYPILOT_NUM_GPUS_PER_NODE="+gpus,
			"SKYPILOT_NODE_RANK="+strconv.Itoa(rank), "SKYPILOT_NUM_NODES="+strconv.Itoa(n), "SKYPILOT_NODE_IPS="+ips)
		// One process group for all the nodes, led by the head: the whole tree is
		// terminated together, and a Ctrl-C aimed at the control plane does not reach
		// replicas it may want to adopt after a restart.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: headPID}
		if err := cmd.Start(); err != nil {
			if headPID != 0 {
				_ = l.Terminate(ctx, strings.Join(nodes, nodeSep))
			}
			return Instance{}, fmt.Errorf("launch %s: node %d: %w", spec.ReplicaID, rank, err)
		}
		pid := cmd.Process.Pid
		go cmd.Wait() // reap; liveness is read from /proc, so the result is not needed
		st, err := readStat(pid)
		if err != nil {
			// It exited already; still a valid handle for Status (gone) and Terminate.
			st.start = 0
		}
		if rank == 0 {
			headPID = pid
		}
		nodes = append(nodes, fmt.Sprintf("%d:%d", pid, st.start))
	}
	l.cfg.Log.Info("local replica started", "replica", spec.ReplicaID, "pid", headPID, "nodes", n, "port", ports[0], "log", l.LogPath(spec.ReplicaID))
	return l.instance(spec.ReplicaID, strings.Join(nodes, nodeSep), ports[0], lb), nil
}

// nodeSep joins the nodes' pid:start in a multi-node replica's handle, head first.
const nodeSep = "+"

// linkMounts makes each file_mounts folder available at its path: a symlink to the source,
// made if the path is free; a path that already is the source (or a link to it) is left
// as it is. Links stay after the replica goes: they point at the user's own folders, and
// other replicas of the service read them. ~ is the home directory, and a relative path
// is relative to it, as SkyPilot places file mounts; a relative source is relative to the
// control plane's working directory, as workdir is.
func linkMounts(mounts []spec.FileMount) error {
	for _, m := range mounts {
		if !m.Local() {
			return fmt.Errorf("file_mounts.%s: the local provider does not mount buckets (%s)", m.Path, m.Source)
		}
		src, err := expandHome(m.Source, false)
		if err != nil {
			return fmt.Errorf("file_mounts.%s: %w", m.Path, err)
		}
		if src, err = filepath.Abs(src); err != nil {
			return fmt.Errorf("file_mounts.%s: %w", m.Path, err)
		}
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("file_mounts.%s: source %w", m.Path, err)
		}
		dst, err := expandHome(m.Path, true)
		if err != nil {
			return fmt.Errorf("file_mounts.%s: %w", m.Path, err)
		}
		if fi, err := os.Stat(dst); err == nil {
			if si, _ := os.Stat(src); os.SameFile(fi, si) {
				continue
			}
			return fmt.Errorf("file_mounts.%s: %s already exists on this machine and is not %s; move it away, or mount at another path", m.Path, dst, src)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("file_mounts.%s: cannot make %s a link to %s: %w", m.Path, dst, src, err)
		}
		if err := os.Symlink(src, dst); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("file_mounts.%s: cannot make %s a link to %s: %w", m.Path, dst, src, err)
		}
	}
	return nil
}

// expandHome resolves ~ and ~/…; with relToHome, any other relative path is under the
// home directory too.
func expandHome(p string, relToHome bool) (string, error) {
	if p != "~" && !strings.HasPrefix(p, "~/") && (!relToHome || filepath.IsAbs(p)) {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	if p == "~" {
		return home, nil
	}
	return filepath.Join(home, strings.TrimPrefix(p, "~/")), nil
}

// Environment variables that record how a local replica is labelled and billed.
const (
	envCapacity = "ARBITER_CAPACITY"
	envRegion   = "ARBITER_REGION"
	envZone     = "ARBITER_ZONE"
	envPrice    = "ARBITER_PRICE_PER_HOUR"
	// envNodes and envNodeRank say how many nodes the replica spans and which one a
	// process is, so that List finds a multi-node replica's nodes again.
	envNodes    = "ARBITER_NUM_NODES"
	envNodeRank = "ARBITER_NODE_RANK"
)

// localLabels is how a local replica is labelled and billed: the service's arbiter.local
// block where it says, else the provider's defaults.
type localLabels struct {
	capacity     fleet.Capacity
	region, zone string
	price        float64
}

func (l *Local) labels(spec LaunchSpec) localLabels {
	lb := localLabels{capacity: l.cfg.Capacity, region: l.cfg.Region, zone: l.cfg.Zone, price: l.cfg.PricePerHour}
	if spec.Capacity != "" {
		lb.capacity = spec.Capacity
	}
	if spec.Region != "" {
		lb.region = spec.Region
	}
	if spec.Zone != "" {
		lb.zone = spec.Zone
	}
	if spec.PricePerHour != nil {
		lb.price = *spec.PricePerHour
	}
	return lb
}

// labelsFromEnv reads back what Launch recorded; a variable missing (a replica launched
// by an older version) keeps the provider's default.
func (l *Local) labelsFromEnv(vars map[string]string) localLabels {
	spec := LaunchSpec{Capacity: fleet.Capacity(vars[envCapacity]), Region: vars[envRegion], Zone: vars[envZone]}
	if p, err := strconv.ParseFloat(vars[envPrice], 64); err == nil {
		spec.PricePerHour = &p
	}
	return l.labels(spec)
}

func (l *Local) instance(id, handle string, port int, lb localLabels) Instance {
	return Instance{ReplicaID: id, Handle: handle, Address: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Capacity: lb.capacity, Region: lb.region, Zone: lb.zone, PricePerHour: lb.price}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// parseHandle reads the head's pid:start from a handle; a multi-node replica's handle
// goes on with its other nodes' (parseNodes).
func parseHandle(h string) (pid int, start uint64, err error) {
	head, _, _ := strings.Cut(h, nodeSep)
	return parseNode(head, h)
}

// nodeProc is one node of a replica; pid 0 is a node found gone (List).
type nodeProc struct {
	pid   int
	start uint64
}

func parseNodes(h string) ([]nodeProc, error) {
	var out []nodeProc
	for i, part := range strings.Split(h, nodeSep) {
		if i > 0 && part == "0:0" {
			out = append(out, nodeProc{})
			continue
		}
		pid, start, err := parseNode(part, h)
		if err != nil {
			return nil, err
		}
		out = append(out, nodeProc{pid, start})
	}
	return out, nil
}

func parseNode(node, h string) (pid int, start uint64, err error) {
	a, b, ok := strings.Cut(node, ":")
	if ok {
		pid, err = strconv.Atoi(a)
		if err == nil {
			start, err = strconv.ParseUint(b, 10, 64)
		}
	}
	if !ok || err != nil || pid <= 1 {
		return 0, 0, fmt.Errorf("local handle %q: want pid:starttime, or several joined by %s", h, nodeSep)
	}
	return pid, start, nil
}

// Status implements Provider: running while every node's process lives (the same
// process: a reused PID has another start time). A multi-node replica is gone when any
// of its nodes is, as a cluster is that loses a node.
func (l *Local) Status(_ context.Context, handle string) (Status, string, error) {
	nodes, err := parseNodes(handle)
	if err != nil {
		return "", "", err
	}
	for rank, n := range nodes {
		if n.pid == 0 || !leaderAlive(n.pid, n.start) {
			if len(nodes) == 1 {
				return StatusGone, "its process exited", nil
			}
			return StatusGone, fmt.Sprintf("the process of node %d of %d exited", rank, len(nodes)), nil
		}
	}
	return StatusRunning, "", nil
}

func leaderAlive(pid int, start uint64) bool {
	st, err := readStat(pid)
	return err == nil && st.start == start && st.state != 'Z' && st.state != 'X'
}

// Terminate implements Provider: SIGTERM to the whole group, SIGKILL after the grace
// period, and returns once no process of the group is left.
func (l *Local) Terminate(ctx context.Context, handle string) error {
	pid, start, err := parseHandle(handle)
	if err != nil {
		return err
	}
	// A leader that is gone may have left children in its group; the group ID is the
	// leader's PID. If the PID was reused by an unrelated process, that process is not in
	// our group (it would have its own), so signalling the group is still safe... unless the
	// new process also leads a group: check the start time before signalling a live leader.
	if st, err := readStat(pid); err == nil && st.start != start && st.state != 'Z' {
		return nil // the PID now belongs to someone else; ours is long gone
	}
	if !groupAlive(pid) {
		return nil
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	if waitGroupGone(ctx, pid, l.cfg.Grace) {
		return nil
	}
	l.cfg.Log.Warn("replica ignored SIGTERM; killing", "pgid", pid, "grace", l.cfg.Grace)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	if waitGroupGone(ctx, pid, 5*time.Second) {
		return nil
	}
	return fmt.Errorf("terminate process group %d: still alive after SIGKILL", pid)
}

func waitGroupGone(ctx context.Context, pgid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !groupAlive(pgid) {
			return true
		}
		select {
		case <-ctx.Done():
			return !groupAlive(pgid)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return !groupAlive(pgid)
}

// List implements Provider: every process group leader whose environment carries our
// owner tag.
func (l *Local) List(context.Context) ([]Instance, error) {
	procs, err := scanProc()
	if err != nil {
		return nil, fmt.Errorf("local provider list: %w", err)
	}
	var out []Instance
	buf, young := make([]byte, 64<<10), youngSince()
	for _, p := range procs {
		if p.pid != p.pgid || p.state == 'Z' {
			continue
		}
		env, err := environ(p.pid, buf, p.start >= young)
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		vars := parseEnviron(env)
		if vars[EnvOwner] != l.cfg.Owner || vars[EnvReplicaID] == "" || cmp.Or(vars[EnvProvider], "local") != l.cfg.Name {
			continue
		}
		port, _ := strconv.Atoi(vars[EnvPort])
		handle := fmt.Sprintf("%d:%d", p.pid, p.start)
		if n, _ := strconv.Atoi(vars[envNodes]); n > 1 {
			handle = groupHandle(procs, p, n, vars[EnvReplicaID], buf, young)
		}
		out = append(out, l.instance(vars[EnvReplicaID], handle, port, l.labelsFromEnv(vars)))
	}
	return out, nil
}

// groupHandle finds the other nodes of a multi-node replica led by head in its process
// group: for each rank, the earliest-started process carrying it (its node's shell; the
// processes it starts inherit the rank). A rank with no live process is written 0:0, so
// that Status reports the replica gone.
func groupHandle(procs []procStat, head procStat, n int, id string, buf []byte, young uint64) string {
	nodes := make([]procStat, n)
	nodes[0] = head
	for _, p := range procs {
		if p.pgid != head.pid || p.pid == head.pid || p.state == 'Z' || p.state == 'X' {
			continue
		}
		env, err := environ(p.pid, buf, p.start >= young)
		if err != nil {
			continue
		}
		vars := parseEnviron(env)
		rank, err := strconv.Atoi(vars[envNodeRank])
		if err != nil || rank < 1 || rank >= n || vars[EnvReplicaID] != id {
			continue
		}
		if q := nodes[rank]; q.pid == 0 || p.start < q.start || (p.start == q.start && p.pid < q.pid) {
			nodes[rank] = p
		}
	}
	parts := make([]string, n)
	for i, p := range nodes {
		parts[i] = fmt.Sprintf("%d:%d", p.pid, p.start)
	}
	return strings.Join(parts, nodeSep)
}

// Notices implements Provider. The local provider's notices come from Preempt.
func (l *Local) Notices() <-chan Notice { return l.notices }

// Preempt announces that handle will be reclaimed after warn, as a spot provider would, and
// then terminates it. For tests and demos.
func (l *Local) Preempt(replicaID, handle string, warn time.Duration) {
	// The reclaim happens at the deadline whether or not anyone read the notice, as a cloud's
	// would; the send must not block the caller.
	time.AfterFunc(warn, func() { _ = l.Terminate(context.Background(), handle) })
	go func() { l.notices <- Notice{ReplicaID: replicaID, Handle: handle, Deadline: time.Now().Add(warn)} }()
}

// Quote implements Provider: this machine is not a market; its replicas take the labels and
// price of the service's arbiter.local block.
func (l *Local) Quote(context.Context, string, *spec.Service) ([]Quote, error) { return nil, nil }

// environ reads a process's environment into buf (or a larger slice, for a larger
// environment). /proc shows it empty while a process is between fork and exec or inside an
// exec, which is where a replica just launched is (bash exec'ing its run: command): for a
// process started within the last few seconds (young), an empty read is retried for up to a
// quarter of a second rather than taken for a process that is not ours, which would leave a
// replica out of the list. It is read in one call: an exec between two reads ends the file
// early, a truncated environment without the tags (seen here).
func environ(pid int, buf []byte, young bool) ([]byte, error) {
	path := fmt.Sprintf("/proc/%d/environ", pid)
	for try := 0; ; try++ {
		b, err := readOnce(path, buf)
		if err != nil || len(b) > 0 || !young || try == 50 {
			return b, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// youngSince is the start time (in /proc's clock ticks since boot, USER_HZ = 100) after
// which a process counts as just started for environ; 0 (all young) when the uptime cannot
// be read.
func youngSince() uint64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	up, err := strconv.ParseFloat(f[0], 64)
	if err != nil || up < 5 {
		return 0
	}
	return uint64((up - 5) * 100)
}

// readOnce reads a file in a single read into buf, and the rest, if it does not fit, after.
func readOnce(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := f.Read(buf)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil || n < len(buf) {
		return buf[:n], err
	}
	rest, err := io.ReadAll(f)
	return append(buf[:n:n], rest...), err
}

type procStat struct {
	pid, pgid int
	state     byte
	start     uint64
}

// readStat parses /proc/PID/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(pid, b)
}

func parseStat(pid int, b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	// After the name: state(3) ppid(4) pgrp(5) ... starttime(22) → indexes 0, 1, 2, 19.
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	pgid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	return procStat{pid: pid, pgid: pgid, state: f[0][0], start: start}, nil
}

func scanProc() ([]procStat, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []procStat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(pid); err == nil {
			out = append(out, st)
		}
	}
	return out, nil
}

// groupAlive reports whether any non-zombie process is in process group pgid. Zombies do
// not count: after a control-plane crash, reaping falls to whatever init the machine has.
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	procs, err := scanProc()
	if err != nil {
		return true
	}
	for _, p := range procs {
		if p.pgid == pgid && p.state != 'Z' && p.state != 'X' {
			return true
		}
	}
	return false
}

// OwnedProcesses lists the PIDs of every live process (leader or not) carrying owner's tag:
// what an operator (or a test) compares with the state file to prove nothing leaked.
func OwnedProcesses(owner string) (map[string][]int, error) {
	procs, err := scanProc()
	if err != nil {
		return nil, err
	}
	out := map[string][]int{}
	buf, young := make([]byte, 64<<10), youngSince()
	for _, p := range procs {
		if p.state == 'Z' || p.state == 'X' || p.pgid == 0 { // pgid 0: a kernel thread
			continue
		}
		env, err := environ(p.pid, buf, p.start >= young)
		if err != nil {
			continue
		}
		vars := parseEnviron(env)
		if vars[EnvOwner] == owner {
			out[vars[EnvReplicaID]] = append(out[vars[EnvReplicaID]], p.pid)
		}
	}
	return out, nil
}

func parseEnviron(b []byte) map[string]string {
	m := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := bytes.Cut(kv, []byte{'='}); ok {
			switch string(k) {
			case EnvOwner, EnvProvider, EnvReplicaID, EnvPort, envCapacity, envRegion, envZone, envPrice, envNodes, envNodeRank:
				m[string(k)] = string(v)
			}
		}
	}
	return m
}
