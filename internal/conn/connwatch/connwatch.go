// Package connwatch tells whether the peer of a TCP connection has gone away, without
// consuming any of its data, so a server blocked on other work can notice a client that
// hung up (fasthttp offers no close notification). It peeks at the socket the way nginx
// checks for a client abort.
package connwatch

import (
	"errors"
	"net"
	"syscall"
)

// PeerClosed reports whether c's peer has closed or reset the connection. It never blocks
// and reads nothing; it reports false when it cannot tell (e.g. a non-socket conn).
//
// It ignores c's deadlines: a server arms a read deadline when a request starts (fasthttp
// keeps read_timeout armed through the handler), and a request held through a long cold
// start or a long generation outlives it with its client still there. RawConn.Read would
// fail at once past the deadline; Control only lends the descriptor, and the peek below is
// non-blocking by itself.
func PeerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	err = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == nil:
			closed = n == 0 // orderly shutdown: EOF
		case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EINTR):
			closed = false // alive, nothing to read
		default:
			closed = true // reset or other socket error
		}
	})
	if err != nil {
		return true // the conn itself is closed
	}
	return closed
}
