//go:build linux

package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// serveEventLoop is the second reference proxy: nginx's design in Go, one epoll loop per
// core on a locked OS thread, each with its own upstream connections, reading each socket
// once per readiness event (no speculative read) and forwarding complete HTTP/1.1 messages
// framed by Content-Length. It parses nothing else, so it is a ceiling, not a proxy anyone
// should run: it tells what the same router logic could reach without goroutines per
// connection.
func serveEventLoop(addr string, upstreams []string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fail(err)
	}
	lf, err := ln.(*net.TCPListener).File()
	if err != nil {
		fail(err)
	}
	lfd := int(lf.Fd())
	if err := unix.SetNonblock(lfd, true); err != nil {
		fail(err)
	}
	var ups []unix.SockaddrInet4
	for _, u := range upstreams {
		ta, err := net.ResolveTCPAddr("tcp", u)
		if err != nil {
			fail(err)
		}
		var sa unix.SockaddrInet4
		sa.Port = ta.Port
		copy(sa.Addr[:], ta.IP.To4())
		ups = append(ups, sa)
	}
	n := runtime.NumCPU()
	done := make(chan error)
	for i := 0; i < n; i++ {
		go func() { done <- runLoop(lfd, ups) }()
	}
	fail(<-done)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "event-loop proxy:", err)
	os.Exit(1)
}

type elConn struct {
	fd       int
	upstream bool
	replica  int
	in       []byte
	peer     *elConn // the other side of the request in flight
}

type loop struct {
	ep    int
	conns map[int]*elConn
	idle  [][]*elConn // per replica
	ups   []unix.SockaddrInet4
	next  int
	buf   []byte
}

func runLoop(lfd int, ups []unix.SockaddrInet4) error {
	runtime.LockOSThread()
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	l := &loop{ep: ep, conns: map[int]*elConn{}, idle: make([][]*elConn, len(ups)), ups: ups, buf: make([]byte, 64<<10)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, lfd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(lfd)}); err != nil {
		return err
	}
	events := make([]unix.EpollEvent, 256)
	for {
		n, err := unix.EpollWait(ep, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				l.accept(lfd)
				continue
			}
			if c := l.conns[fd]; c != nil {
				l.readable(c)
			}
		}
	}
}

func (l *loop) add(fd int, c *elConn) {
	l.conns[fd] = c
	_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)})
}

func (l *loop) close(c *elConn) {
	delete(l.conns, c.fd)
	_ = unix.Close(c.fd)
	if p := c.peer; p != nil {
		// A client without its answer, or an upstream mid-response: neither is reusable.
		p.peer = nil
		l.close(p)
	}
}

func (l *loop) accept(lfd int) {
	for {
		fd, _, err := unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: another loop took it, or none left
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		l.add(fd, &elConn{fd: fd})
	}
}

func (l *loop) upstream(replica int) (*elConn, error) {
	if idle := l.idle[replica]; len(idle) > 0 {
		c := idle[len(idle)-1]
		l.idle[replica] = idle[:len(idle)-1]
		return c, nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	sa := l.ups[replica]
	if err := unix.Connect(fd, &sa); err != nil { // blocking: loopback, warm-up only
		unix.Close(fd)
		return nil, err
	}
	_ = unix.SetNonblock(fd, true)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	c := &elConn{fd: fd, upstream: true, replica: replica}
	l.add(fd, c)
	return c, nil
}

// readable reads once: a short read means the socket is drained, so the next read waits
// for the next readiness event instead of failing with EAGAIN.
func (l *loop) readable(c *elConn) {
	n, err := unix.Read(c.fd, l.buf)
	if n <= 0 {
		if err == unix.EAGAIN {
			return
		}
		if c.upstream {
			l.dropIdle(c)
		}
		l.close(c)
		return
	}
	c.in = append(c.in, l.buf[:n]...)
	if c.upstream {
		l.response(c)
	} else {
		l.request(c)
	}
}

func (l *loop) request(c *elConn) {
	if c.peer != nil {
		return // one request at a time per client (no pipelining)
	}
	size := messageSize(c.in)
	if size < 0 {
		return
	}
	replica := l.next % len(l.ups)
	l.next++
	u, err := l.upstream(replica)
	if err != nil {
		unix.Write(c.fd, []byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
		l.close(c)
		return
	}
	if w, err := unix.Write(u.fd, c.in[:size]); err != nil || w != size {
		l.close(u)
		l.close(c)
		return
	}
	c.in = append(c.in[:0], c.in[size:]...)
	c.peer, u.peer = u, c
}

func (l *loop) response(u *elConn) {
	size := messageSize(u.in)
	if size < 0 {
		return
	}
	c := u.peer
	u.peer = nil
	if c != nil {
		c.peer = nil
		if w, err := unix.Write(c.fd, u.in[:size]); err != nil || w != size {
			l.close(c)
		}
	}
	u.in = append(u.in[:0], u.in[size:]...)
	l.idle[u.replica] = append(l.idle[u.replica], u)
	if c != nil && len(c.in) > 0 {
		l.request(c)
	}
}

func (l *loop) dropIdle(c *elConn) {
	idle := l.idle[c.replica]
	for i, x := range idle {
		if x == c {
			l.idle[c.replica] = append(idle[:i], idle[i+1:]...)
			return
		}
	}
}

var contentLength = []byte("\r\ncontent-length:")

// messageSize is the length of the complete HTTP/1.1 message at the start of b, or -1.
func messageSize(b []byte) int {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return -1
	}
	head := b[:end+2]
	body := 0
	for i := 0; i+len(contentLength) <= len(head); i++ {
		if head[i] == '\r' && bytes.EqualFold(head[i:i+len(contentLength)], contentLength) {
			rest := head[i+len(contentLength):]
			j := bytes.IndexByte(rest, '\r')
			v, err := strconv.Atoi(string(bytes.TrimSpace(rest[:j])))
			if err != nil {
				return -1
			}
			body = v
			break
		}
	}
	if len(b) < end+4+body {
		return -1
	}
	return end + 4 + body
}
