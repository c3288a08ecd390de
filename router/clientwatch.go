package router

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/internal/conn/connwatch"
)

// watchInterval is how long a request waits on a replica before its client is first
// checked, and then how often: fast requests never pay for a check.
const watchInterval = 100 * time.Millisecond

// watchIdleTicks is how many empty scans the watcher makes before its goroutine exits (a
// new wait starts it again), so an idle router does not tick.
const watchIdleTicks = 20

// clientWatch is one request waiting on a replica for its response header.
type clientWatch struct {
	client   net.Conn
	upstream io.Closer // closed when the client is found gone: that cancels the generation
	since    time.Time
	idx      int // position in clientWatcher.waiting; -1 once removed (guarded by the watcher's mu)

	// mu serializes a check with the request's end: once the request goes back to its
	// client connection, a peek must not run on it (it would wait behind the server's read).
	mu   sync.Mutex
	done bool // the request stopped waiting
	gone bool // the client was found gone
}

// clientWatcher checks, from one goroutine, the clients of the requests waiting on a
// replica, and aborts the upstream request of any that hung up. One shared scan instead of
// a timer per request keeps the cost of a fast request to two short critical sections.
type clientWatcher struct {
	mu      sync.Mutex
	waiting []*clientWatch
	running bool
	scratch []*clientWatch // the scan's copy; only the scanning goroutine touches it
}

// add starts watching client for a request waiting on upstream since then. w may be
// reused for the request's next attempt once remove has returned.
func (cw *clientWatcher) add(w *clientWatch, client net.Conn, upstream io.Closer, since time.Time) {
	w.mu.Lock()
	w.client, w.upstream, w.since, w.done, w.gone = client, upstream, since, false, false
	w.mu.Unlock()
	cw.mu.Lock()
	w.idx = len(cw.waiting)
	cw.waiting = append(cw.waiting, w)
	if !cw.running {
		cw.running = true
		go cw.loop()
	}
	cw.mu.Unlock()
}

// remove stops watching w and reports whether its client was found gone (its upstream
// connection is then closed). After remove returns, the watcher no longer touches w's
// connections.
func (cw *clientWatcher) remove(w *clientWatch) bool {
	cw.mu.Lock()
	if w.idx >= 0 {
		last := len(cw.waiting) - 1
		moved := cw.waiting[last]
		cw.waiting[w.idx], moved.idx = moved, w.idx
		cw.waiting[last] = nil
		cw.waiting = cw.waiting[:last]
		w.idx = -1
	}
	cw.mu.Unlock()
	w.mu.Lock()
	w.done = true
	gone := w.gone
	w.mu.Unlock()
	return gone
}

func (cw *clientWatcher) loop() {
	t := time.NewTicker(watchInterval / 2)
	defer t.Stop()
	idle := 0
	for now := range t.C {
		cw.mu.Lock()
		if len(cw.waiting) == 0 {
			if idle++; idle >= watchIdleTicks {
				cw.running = false
				cw.mu.Unlock()
				return
			}
		} else {
			idle = 0
		}
		// Copy out the requests due a check so the socket peeks run outside the lock.
		due := cw.scratch[:0]
		for _, w := range cw.waiting {
			if now.Sub(w.since) >= watchInterval {
				due = append(due, w)
			}
		}
		cw.mu.Unlock()
		for i, w := range due {
			w.mu.Lock()
			if !w.done && !w.gone && connwatch.PeerClosed(w.client) {
				w.gone = true
				_ = w.upstream.Close()
			}
			w.mu.Unlock()
			due[i] = nil
		}
		cw.scratch = due[:0]
	}
}
