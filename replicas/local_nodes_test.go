package replicas

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/spec"
)

// waitFile waits for path to hold a line, for a replica's script that writes it.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			return string(b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never written", path)
	return ""
}

// A replica of num_nodes nodes is one group of processes, each node with SkyPilot's
// variables (SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS with the head
// first); the address is the head's; List finds the whole group again; one node's death
// makes the replica gone; Terminate ends every node.
func TestLocalMultiNodeReplica(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	dir := t.TempDir()
	run := `printf '%s %s %s %s\n' "$SKYPILOT_NODE_RANK" "$SKYPILOT_NUM_NODES" "$(echo "$SKYPILOT_NODE_IPS" | wc -l)" "$PORT" > ` + dir + `/node-$SKYPILOT_NODE_RANK; exec sleep 60`
	inst, err := l.Launch(ctx, LaunchSpec{ReplicaID: "svc-1", Run: run, NumNodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	var ports []string
	for rank := range 3 {
		f := strings.Fields(waitFile(t, filepath.Join(dir, "node-"+strconv.Itoa(rank))))
		if len(f) != 4 || f[0] != strconv.Itoa(rank) || f[1] != "3" || f[2] != "3" {
			t.Fatalf("node %d saw %q; want rank %d of 3 with 3 IPs", rank, f, rank)
		}
		ports = append(ports, f[3])
	}
	if !strings.HasSuffix(inst.Address, ":"+ports[0]) || ports[0] == ports[1] {
		t.Errorf("address %s, node ports %v: want the head's, each node its own", inst.Address, ports)
	}
	if n := strings.Count(inst.Handle, nodeSep) + 1; n != 3 {
		t.Fatalf("handle %q names %d nodes", inst.Handle, n)
	}
	list, err := l.List(ctx)
	if err != nil || len(list) != 1 || list[0].Handle != inst.Handle {
		t.Fatalf("List = %+v, %v; want the group as launched (%s)", list, err, inst.Handle)
	}
	if st, _, _ := l.Status(ctx, inst.Handle); st != StatusRunning {
		t.Fatalf("status %v", st)
	}
	nodes, _ := parseNodes(inst.Handle)
	_ = syscall.Kill(nodes[2].pid, syscall.SIGKILL) // one node dies: the replica is gone
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, why, _ := l.Status(ctx, inst.Handle)
		if st == StatusGone {
			if !strings.Contains(why, "node 2 of 3") {
				t.Errorf("reason %q", why)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a replica with a dead node still reads running")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// After a restart List says so too: the dead node is 0:0 in the handle it rebuilds.
	if list, _ := l.List(ctx); len(list) != 1 || !strings.HasSuffix(list[0].Handle, "+0:0") {
		t.Errorf("List after a node died: %+v", list)
	}
	if err := l.Terminate(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if procs, _ := OwnedProcesses(l.cfg.Owner); len(procs) != 0 {
		t.Fatalf("processes left: %v", procs)
	}
}

// The local bound counts nodes: a replica of 3 nodes does not fit where 2 are left.
func TestLocalMultiNodeCapacity(t *testing.T) {
	l := newTestLocal(t)
	l.cfg.MaxReplicas = 4
	if _, err := l.Launch(context.Background(), LaunchSpec{ReplicaID: "s-1", Run: "exec sleep 60", NumNodes: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Launch(context.Background(), LaunchSpec{ReplicaID: "s-2", Run: "exec sleep 60", NumNodes: 3}); err == nil || !strings.Contains(err.Error(), "2 replica nodes and this replica needs 3") {
		t.Fatalf("launch over the bound: %v", err)
	}
}

// A file_mounts folder is found at its path by the run: script (a link the provider
// makes); a path already taken by something else fails the launch, naming the key.
func TestLocalFileMounts(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	src, base := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "weights.txt"), []byte("w1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "mnt", "data")
	out := filepath.Join(base, "out")
	run := "cat " + dst + "/weights.txt > " + out + "; exec sleep 60"
	if _, err := l.Launch(ctx, LaunchSpec{ReplicaID: "m-1", Run: run, FileMounts: []spec.FileMount{{Path: dst, Source: src}}}); err != nil {
		t.Fatal(err)
	}
	if got := waitFile(t, out); got != "w1\n" {
		t.Fatalf("the replica read %q", got)
	}
	// A second replica finds the link already there.
	if _, err := l.Launch(ctx, LaunchSpec{ReplicaID: "m-2", Run: "exec sleep 60", FileMounts: []spec.FileMount{{Path: dst, Source: src}}}); err != nil {
		t.Fatal(err)
	}
	taken := filepath.Join(base, "taken")
	if err := os.Mkdir(taken, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := l.Launch(ctx, LaunchSpec{ReplicaID: "m-3", Run: "exec sleep 60", FileMounts: []spec.FileMount{{Path: taken, Source: src}}})
	if err == nil || !strings.Contains(err.Error(), "file_mounts."+taken+": "+taken+" already exists on this machine and is not "+src) {
		t.Fatalf("launch onto a taken path: %v", err)
	}
}
