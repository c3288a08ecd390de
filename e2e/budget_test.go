package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
)

const (
	budgetAcmeKey = "sk-e2e-acme-0123456789abcdef"
	budgetBetaKey = "sk-e2e-beta-0123456789abcdef"
)

// metricValue sums a family's samples whose labels include every name="value" given.
func metricValue(t *testing.T, admin, name string, labels ...string) float64 {
	t.Helper()
	code, body := httpGet(t, "http://"+admin+"/metrics")
	if code != 200 {
		return -1
	}
	sum := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`\{([^}]*)\} (\S+)$`).FindAllStringSubmatch(body, -1) {
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && strings.Contains(m[1], labels[i]+`="`+labels[i+1]+`"`)
		}
		if ok {
			v, _ := strconv.ParseFloat(m[2], 64)
			sum += v
		}
	}
	return sum
}

// A tenant's budget across two routers, a control-plane kill -9 and a router restart
// (issue 52): the real control plane (cmd/autoscaler, its SQLite state) and two real
// router processes, each given the same keys file. The hard limit is set, by a live reload
// of that file, to six and a half requests' worth: the requests are sent through the two
// routers in turn, and the seventh is refused although neither router alone counted half of
// them, so each read the other's spend. After the control plane is killed and started again
// and a router restarted, both still refuse the tenant: no spend was lost. Another tenant is
// served throughout.
func TestBudgetSharedByTwoRoutersAcrossRestarts(t *testing.T) {
	c := newCluster(t)
	c.apiURL = "http://" + c.api
	startControl := c.startAutoscaler
	cp := startControl()
	keysPath := filepath.Join(c.home, "keys.yaml")
	writeKeys := func(soft, hard float64) {
		body := fmt.Sprintf("keys:\n  - {name: acme-1, key: %s, tenant: acme}\n  - {name: beta, key: %s}\ntenants:\n  - {name: acme, budget: {period: month, soft_dollars: %g, hard_dollars: %g}}\n",
			budgetAcmeKey, budgetBetaKey, soft, hard)
		// Written whole under another name, then renamed: a router never reads half a file.
		if err := os.WriteFile(keysPath+".tmp", []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(keysPath+".tmp", keysPath); err != nil {
			t.Fatal(err)
		}
	}
	writeKeys(1e6, 1e6)
	type front struct {
		p            *proc
		listen, admn string
		id           string
	}
	startRouter := func(i int, listen, admin string) *front {
		id := fmt.Sprintf("router-%d", i)
		p := startProc(t, filepath.Join(c.home, id+".log"), "router", "-listen", listen, "-admin", admin, "-id", id,
			"-control", c.apiURL, "-token-file", control.TokenPath(c.home), "-api-keys", keysPath, "-log-level", "warn")
		return &front{p: p, listen: listen, admn: admin, id: id}
	}
	routers := []*front{startRouter(1, freeAddr(t), freeAddr(t)), startRouter(2, freeAddr(t), freeAddr(t))}
	c.up("budget", simService("budget-model", "  replicas: 1", "-default-max-tokens 16")+"  local: {price_per_hour: 36}\n")
	send := func(f *front, key string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+f.listen+"/v1/chat/completions",
			strings.NewReader(`{"model":"budget-model","messages":[{"role":"user","content":"how much is left"}],"max_tokens":16}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, f := range routers {
		c.waitFor(f.id+" serving the replica", 60*time.Second, func() bool { code, _ := send(f, budgetBetaKey); return code == 200 })
	}
	spent := func(f *front) float64 {
		return metricValue(t, f.admn, "arbiter_router_tenant_spend_dollars", "tenant", "acme")
	}
	counted := func(f *front) float64 {
		return metricValue(t, f.admn, "arbiter_router_tenant_dollars_total", "tenant", "acme")
	}

	// One request tells what a request costs.
	if code, body := send(routers[0], budgetAcmeKey); code != 200 {
		t.Fatalf("the first request: %d %s", code, body)
	}
	per := counted(routers[0])
	if per <= 0 {
		t.Fatalf("a request cost $%v; want a price (the replica's $36/h over its tokens per second)", per)
	}
	synced := func(total float64) {
		for _, f := range routers {
			c.waitFor(fmt.Sprintf("%s knowing acme's $%.6f", f.id, total), 20*time.Second, func() bool { return spent(f) >= total-1e-9 })
		}
	}
	synced(per)
	hard := 6.5 * per
	writeKeys(3*per, hard)
	for _, f := range routers {
		c.waitFor(f.id+" reloading the budget", 20*time.Second, func() bool {
			return metricValue(t, f.admn, "arbiter_router_tenant_budget_dollars", "tenant", "acme", "limit", "hard") == hard
		})
	}
	answered := 1
	var refused string
	for i := 1; i < 20 && refused == ""; i++ {
		f := routers[i%2]
		code, body := send(f, budgetAcmeKey)
		switch {
		case code == 200:
			answered++
			synced(float64(answered) * per * 0.999)
		case code == 429 && strings.Contains(body, `"budget_exceeded"`):
			refused = fmt.Sprintf("%s: %s", f.id, body)
		default:
			t.Fatalf("request %d through %s: %d %s", i, f.id, code, body)
		}
	}
	alone := []float64{counted(routers[0]), counted(routers[1])}
	t.Logf("acme: %d requests answered at $%.6f each, then refused by %s; counted by each router: $%.6f and $%.6f; hard limit $%.6f",
		answered, per, refused, alone[0], alone[1], hard)
	if answered != 7 || alone[0] >= hard/2+per || alone[1] >= hard/2+per {
		t.Fatalf("%d answered (want 7: the budget read across both routers), each router counted %v", answered, alone)
	}
	for _, f := range routers {
		if code, body := send(f, budgetAcmeKey); code != 429 || !strings.Contains(body, "monthly hard limit") {
			t.Fatalf("%s after the limit: %d %s", f.id, code, body)
		}
	}

	// kill -9 of the control plane (its last tick saved the spend), a new one on the same
	// state; a router restarted (SIGTERM: it sends what it has not reported).
	cp.kill()
	cp = startControl()
	_ = syscall.Kill(routers[0].p.cmd.Process.Pid, syscall.SIGTERM)
	<-routers[0].p.done
	routers[0] = startRouter(1, routers[0].listen, routers[0].admn)
	c.waitFor("router-1 back", 60*time.Second, func() bool { code, _ := send(routers[0], budgetBetaKey); return code == 200 })
	synced(7 * per * 0.999)
	for _, f := range routers {
		if code, body := send(f, budgetAcmeKey); code != 429 || !strings.Contains(body, "budget_exceeded") {
			t.Fatalf("%s after the restarts: %d %s; want the budget still spent", f.id, code, body)
		}
	}
	if code, body := send(routers[1], budgetBetaKey); code != 200 {
		t.Fatalf("another tenant after the restarts: %d %s", code, body)
	}
	c.serve("down", "--all", "--wait", "60s")
	cp.kill()
}
