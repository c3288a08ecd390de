package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func TestLastLines(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc", 2, "b\nc"},
		{"a\nb\nc\n", 3, "a\nb\nc\n"},
		{"a\nb\nc\n", 5, "a\nb\nc\n"},
		{"a\n", 1, "a\n"},
		{"", 3, ""},
	} {
		if got := string(lastLines([]byte(c.in), c.n)); got != c.want {
			t.Errorf("lastLines(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// The control plane answers a replica's log 1 MiB at a time (control/api.go): --tail reads
// to the end before it prints, so the lines are the log's last, not the first chunk's.
func TestLogsTailReadsALongLogToItsEnd(t *testing.T) {
	var log bytes.Buffer
	for i := range 100_000 { // about 2.3 MB
		fmt.Fprintf(&log, "line %06d of the replica\n", i)
	}
	const chunk = 1 << 20
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/health":
			fmt.Fprint(w, `{"ok":true}`)
		case r.URL.Path == "/v1/services/svc":
			fmt.Fprint(w, `{"name":"svc"}`)
		case r.URL.Path == "/v1/logs/svc-1":
			off, _ := strconv.Atoi(r.URL.Query().Get("offset"))
			b := log.Bytes()[min(off, log.Len()):]
			b = b[:min(len(b), chunk)]
			w.Header().Set("X-Log-Offset", strconv.Itoa(off+len(b)))
			_, _ = w.Write(b)
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()
	cmd := root()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--home", t.TempDir(), "--api", api.URL, "logs", "svc", "svc-1", "--tail", "3"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if want := "line 099997 of the replica\nline 099998 of the replica\nline 099999 of the replica\n"; out.String() != want {
		t.Fatalf("logs --tail 3 printed %q, want %q", strings.TrimSpace(out.String()), want)
	}
}
