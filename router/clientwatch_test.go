package router

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

type closeCounter struct{ n atomic.Int32 }

func (c *closeCounter) Close() error { c.n.Add(1); return nil }

// tcpPair returns the server side of a loopback connection and its client side.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func TestClientWatcherAbortsOnlyTheUpstreamOfAClientThatLeft(t *testing.T) {
	var cw clientWatcher
	goneSrv, goneCli := tcpPair(t)
	stayedSrv, _ := tcpPair(t)
	var goneUp, stayedUp closeCounter
	var wGone, wStayed clientWatch
	cw.add(&wGone, goneSrv, &goneUp, time.Now())
	cw.add(&wStayed, stayedSrv, &stayedUp, time.Now())
	_ = goneCli.Close()

	deadline := time.Now().Add(5 * time.Second)
	for goneUp.n.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if goneUp.n.Load() != 1 {
		t.Fatalf("upstream of the client that left closed %d times, want 1", goneUp.n.Load())
	}
	if !cw.remove(&wGone) {
		t.Fatal("remove did not report the client gone")
	}
	if cw.remove(&wStayed) || stayedUp.n.Load() != 0 {
		t.Fatalf("a client still connected was reported gone (upstream closed %d times)", stayedUp.n.Load())
	}

	// A request that stops waiting is never touched again, even if its client leaves later.
	srv, cli := tcpPair(t)
	var up closeCounter
	var w clientWatch
	cw.add(&w, srv, &up, time.Now().Add(-time.Hour))
	if cw.remove(&w) {
		t.Fatal("fresh request reported gone")
	}
	_ = cli.Close()
	time.Sleep(3 * watchInterval)
	if up.n.Load() != 0 {
		t.Fatal("the upstream of a request that had stopped waiting was closed")
	}

	// With nothing to watch, the goroutine ends.
	deadline = time.Now().Add(5 * time.Second)
	for {
		cw.mu.Lock()
		running := cw.running
		cw.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher kept running with nothing to watch")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
