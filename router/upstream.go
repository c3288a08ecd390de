package router

import (
	"bufio"
	"net"
	"sync"
	"time"
)

// upConn is one pooled HTTP/1.1 connection to a replica. Owning the socket (rather than
// using fasthttp.HostClient) is what lets the router abort an upstream request when its
// client hangs up: closing the socket is how vLLM learns to stop generating.
type upConn struct {
	net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	lastUsed time.Time
}

// connPool keeps idle keep-alive connections to one replica.
type connPool struct {
	addr        string
	dialTimeout time.Duration
	// idleTimeout is kept below vLLM's 5 s keep-alive so the router drops an idle socket
	// before the replica does; a socket that still died is retried on a fresh dial.
	idleTimeout time.Duration
	maxIdle     int

	mu     sync.Mutex // guards idle, closed
	idle   []*upConn  // LIFO: the most recently used socket is the least likely to be stale
	closed bool
}

func newConnPool(addr string, dialTimeout, idleTimeout time.Duration, maxIdle int) *connPool {
	return &connPool{addr: addr, dialTimeout: dialTimeout, idleTimeout: idleTimeout, maxIdle: maxIdle}
}

// get returns an idle connection (reused=true) or dials a new one.
func (p *connPool) get(now time.Time, deadline time.Time) (c *upConn, reused bool, err error) {
	p.mu.Lock()
	for len(p.idle) > 0 {
		c = p.idle[len(p.idle)-1]
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
		if now.Sub(c.lastUsed) < p.idleTimeout {
			p.mu.Unlock()
			return c, true, nil
		}
		_ = c.Close()
	}
	p.mu.Unlock()
	return p.dial(deadline)
}

func (p *connPool) dial(deadline time.Time) (*upConn, bool, error) {
	timeout := p.dialTimeout
	if d := time.Until(deadline); d < timeout {
		timeout = d
	}
	if timeout <= 0 {
		return nil, false, errDeadline
	}
	nc, err := net.DialTimeout("tcp", p.addr, timeout)
	if err != nil {
		return nil, false, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // SSE events are small and must not wait for Nagle
	}
	// Small buffers: thousands of concurrent streams each hold one connection, and larger
	// requests simply write through.
	return &upConn{Conn: nc, br: bufio.NewReaderSize(nc, 8<<10), bw: bufio.NewWriterSize(nc, 4<<10)}, false, nil
}

// put returns a healthy connection whose response was fully read. Its last deadline stays
// set: an idle socket does no I/O, and the next request sets its own.
func (p *connPool) put(c *upConn, now time.Time) {
	c.lastUsed = now
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.maxIdle {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// close drops every idle connection; in-flight ones are closed by their requests.
func (p *connPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}
