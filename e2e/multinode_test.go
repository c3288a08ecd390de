package e2e

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nodeRank reads the SKYPILOT_NODE_RANK a process was started with; -1 if it has none.
func nodeRank(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return -1
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "SKYPILOT_NODE_RANK="); ok {
			if r, err := strconv.Atoi(v); err == nil {
				return r
			}
		}
	}
	return -1
}

// A replica of num_nodes: 2 on the local provider is two replicasim processes, each with
// SkyPilot's node variables; the router talks to the head; the service is billed for every
// node; and the death of a worker node replaces the whole group while a non-streaming load
// sees no request fail (those the dying head held had sent no byte and are retried).
func TestMultiNodeReplicaGroupReplacedOnNodeDeath(t *testing.T) {
	c := newCluster(t)
	yaml := strings.Replace(simService("mn-model", "  replicas: 2", ""), "run: exec replicasim",
		"num_nodes: 2\nrun: test \"$SKYPILOT_NUM_NODES\" = 2 && test \"$(echo \"$SKYPILOT_NODE_IPS\" | wc -l)\" = 2 && exec replicasim", 1)
	yaml = strings.Replace(yaml, "arbiter:\n", "arbiter:\n  local: {price_per_hour: 1.5}\n", 1)
	c.up("mn", yaml)
	st := c.status("mn")
	if st.Ready != 2 || st.DollarsPerHour != 2*2*1.5 {
		t.Fatalf("status %+v; want 2 ready replicas billed 2 nodes × $1.5/h each ($6/h)", st)
	}
	victim := st.Replicas[0].ID
	pids := c.owned()[victim]
	var worker int
	ranks := map[int]bool{}
	for _, pid := range pids {
		r := nodeRank(pid)
		ranks[r] = true
		if r == 1 {
			worker = pid
		}
	}
	if !ranks[0] || !ranks[1] || worker == 0 {
		t.Fatalf("processes of %s %v carry ranks %v; want a head (0) and a worker (1)", victim, pids, ranks)
	}
	l := c.startLoad("mn-model", 4, 60, false)
	time.Sleep(time.Second)
	_ = syscall.Kill(worker, syscall.SIGKILL)
	c.waitFor("the group replaced", 60*time.Second, func() bool {
		st := c.status("mn")
		return st.Ready == 2 && !slices.Contains(replicaIDs(st), victim)
	})
	l.finish(t, "non-streaming load through a worker node's death")
	if ev := c.serve("logs", "mn"); !strings.Contains(ev, "node 1 of 2 exited") {
		t.Fatalf("no event naming the dead node:\n%s", ev)
	}
	c.waitFor("the old group's processes gone", 30*time.Second, func() bool {
		_, left := c.owned()[victim]
		return !left
	})
}
