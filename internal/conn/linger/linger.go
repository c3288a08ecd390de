// Package linger closes server connections the way nginx's lingering_close does. A
// server that refuses a request before reading all of it (a body over the limit: 413; a
// connection shed: 503) and closes at once leaves the client's unread bytes in the
// socket, and the kernel then answers with a reset, which destroys the response the
// client has not read yet: it sees "connection reset" instead of the reason. A lingering
// close sends FIN after the response, reads and discards what the client is still
// sending, for a bounded time, and only then closes.
package linger

import (
	"net"
	"sync/atomic"
	"time"
)

// Listener wraps ln so that each accepted TCP connection, when the server closes it,
// sends its FIN and then, in the background, discards what the client still sends until
// the client closes too, or sends nothing for idle, or timeout has passed. A client that
// closed first (the common case) costs nothing more: its EOF is read at once. At most
// maxLingering connections linger at once (each holds a descriptor); beyond, a close is
// plain.
func Listener(ln net.Listener, idle, timeout time.Duration, maxLingering int) net.Listener {
	return &listener{Listener: ln, idle: idle, timeout: timeout, max: int64(maxLingering)}
}

type listener struct {
	net.Listener
	idle, timeout time.Duration
	max           int64
	lingering     atomic.Int64
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &conn{TCPConn: tc, l: l}, nil
	}
	return c, nil
}

type conn struct {
	*net.TCPConn
	l      *listener
	closed atomic.Bool
}

// Close returns at once: servers close from loops that must not wait (fasthttp sheds a
// connection over its limit from its accept loop).
func (c *conn) Close() error {
	l := c.l
	if c.closed.Swap(true) || l.timeout <= 0 {
		return c.TCPConn.Close()
	}
	if l.lingering.Add(1) > l.max || c.CloseWrite() != nil {
		l.lingering.Add(-1)
		return c.TCPConn.Close()
	}
	go func() {
		defer l.lingering.Add(-1)
		end := time.Now().Add(l.timeout)
		buf := make([]byte, 16<<10)
		for {
			next := time.Now().Add(l.idle)
			if next.After(end) {
				next = end
			}
			_ = c.SetReadDeadline(next)
			if _, err := c.Read(buf); err != nil {
				break // EOF (the client closed), reset, idle or out of time: done either way
			}
		}
		_ = c.TCPConn.Close()
	}()
	return nil
}
