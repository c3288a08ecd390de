package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve update --mode blue_green under load: every request is answered by the old version
// until the new one has its whole target ready, then by the new one; never both taking new
// requests at once, even though one new replica gets ready seconds before the other (a
// rolling update would mix them for those seconds). The versions tell themselves apart by
// the answer's length.
func TestBlueGreenUpdateUnderLoad(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const model = "bg-model"
	if up := c.up("bg", simService(model, "  replicas: 2", "-stop-after 32")); strings.Contains(up, "\x1b[") {
		t.Errorf("serve up with no terminal wrote control characters:\n%q", up)
	}
	if st := c.status("bg"); st.Ready != 2 {
		t.Fatalf("after up: %d ready; want 2", st.Ready)
	}

	type answer struct {
		start  time.Time
		tokens int
	}
	var mu sync.Mutex
	var answers []answer
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 5000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				resp, err := client.Post("http://"+c.listen+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"which version are you?"}]}`))
				if err != nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var body struct {
					Usage struct {
						Completion int `json:"completion_tokens"`
					} `json:"usage"`
				}
				mu.Lock()
				if err := json.Unmarshal(b, &body); resp.StatusCode != 200 || err != nil {
					failures = append(failures, fmt.Sprintf("%d %s", resp.StatusCode, b))
				} else {
					answers = append(answers, answer{start, body.Usage.Completion})
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Second)
	// The new version's replicas get ready 4 s apart (their numbers are 3 and 4).
	path := c.writeSpec("bg-v2", simService(model, "  replicas: 2", `-stop-after 48 -ready-delay $(( ${ARBITER_REPLICA_ID##*-} % 2 * 4 ))s`))
	// On a terminal, with a status line kept in place while the replicas start.
	tty := exec.Command("script", "-qec", shellJoin([]string{filepath.Join(binDir, "serve"), "--home", c.home, "update", "bg", path, "--mode", "blue_green"}), "/dev/null")
	tty.Env = append(append(os.Environ(), c.env...), "ARBITER_HOME="+c.home)
	b, err := tty.CombinedOutput()
	out := string(b)
	if err != nil || !strings.Contains(out, "blue-green update to version 2") || !strings.Contains(out, "Service bg is ready: 2/2 replicas of version 2.") {
		t.Errorf("serve update --mode blue_green: %v\n%s", err, out)
	}
	if !strings.Contains(out, "\r\x1b[K") || !strings.Contains(out, "bg version 2: ") {
		t.Errorf("serve update on a terminal kept no status line:\n%q", out)
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()

	if len(failures) > 0 {
		t.Fatalf("%d requests failed during the update, e.g. %s", len(failures), failures[0])
	}
	var firstNew time.Time
	old, updated := 0, 0
	for _, a := range answers {
		switch a.tokens {
		case 32:
			old++
		case 48:
			updated++
			if firstNew.IsZero() || a.start.Before(firstNew) {
				firstNew = a.start
			}
		default:
			t.Fatalf("an answer of %d tokens: from neither version", a.tokens)
		}
	}
	if old == 0 || updated == 0 {
		t.Fatalf("%d answers from the old version, %d from the new: the load did not span the update", old, updated)
	}
	// A request sent just before the switch may still be picked from the old set; beyond
	// that, the old version takes nothing new.
	late := 0
	for _, a := range answers {
		if a.tokens == 32 && a.start.After(firstNew.Add(500*time.Millisecond)) {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d requests sent more than 0.5 s after the new version first answered were answered by the old one: both versions served at once", late)
	}
	st := c.status("bg")
	if st.Version != 2 || st.Ready != 2 || len(st.Replicas) != 2 {
		t.Fatalf("after the update: %+v", st)
	}
	if logs := c.serve("logs", "bg", "--no-follow"); !strings.Contains(logs, "traffic switches to it") {
		t.Errorf("the event log does not record the switch:\n%s", logs)
	}
	t.Logf("%d answers from version 1, %d from version 2", old, updated)
	c.serve("down", "bg")
}
