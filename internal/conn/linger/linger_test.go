package linger

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// serve runs a fasthttp server that takes bodies of at most 1 MiB on a loopback port.
func serve(t *testing.T, wrap func(net.Listener) net.Listener) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {}, MaxRequestBodySize: 1 << 20, Logger: quiet{},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			ctx.Error("too large", fasthttp.StatusRequestEntityTooLarge)
		}}
	go func() { _ = srv.Serve(wrap(ln)) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// refused sends n oversized bodies at once and counts the 413s the client got to read.
func refused(url string, n int) (got413 int, errs []error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	body := bytes.Repeat([]byte("a"), 9<<20)
	client := &http.Client{Timeout: 30 * time.Second}
	for range n {
		wg.Go(func() {
			resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 413 {
				errs = append(errs, fmt.Errorf("status %d", resp.StatusCode))
			}
			if resp.StatusCode == http.StatusRequestEntityTooLarge {
				got413++
			}
		})
	}
	wg.Wait()
	return got413, errs
}

// Every client that sends a body over the limit reads the server's 413, rather than a
// connection reset.
func TestOversizedBodiesGetTheirAnswer(t *testing.T) {
	url := serve(t, func(ln net.Listener) net.Listener { return Listener(ln, 250*time.Millisecond, 5*time.Second, 64) })
	const n = 16
	got, errs := refused(url, n)
	if got != n {
		t.Fatalf("%d of %d clients read the 413; errors: %v", got, n, errs)
	}
}

// Without lingering, the same clients see resets: the test above can fail. (Logged, not
// asserted: whether a reset wins the race depends on the machine.)
func TestWithoutLingeringClientsSeeResets(t *testing.T) {
	url := serve(t, func(ln net.Listener) net.Listener { return ln })
	got, errs := refused(url, 16)
	t.Logf("without lingering: %d of 16 read the 413; %d errors (first: %v)", got, len(errs), first(errs))
}

func first(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
