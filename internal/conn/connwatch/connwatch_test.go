package connwatch

import (
	"net"
	"testing"
	"time"
)

func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if PeerClosed(server) {
		t.Fatal("open connection reported closed")
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if PeerClosed(server) {
		t.Fatal("connection with unread data reported closed")
	}
	buf := make([]byte, 1)
	if n, _ := server.Read(buf); n != 1 {
		t.Fatal("peek consumed the data")
	}
	client.Close()
	deadline := time.Now().Add(2 * time.Second)
	for !PeerClosed(server) {
		if time.Now().After(deadline) {
			t.Fatal("closed peer not detected")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A server's read deadline (fasthttp arms read_timeout when a request starts and leaves it
// armed through the handler) says nothing about the peer: a request held through a 40 s
// cold start, or a whole response generated for minutes, outlives it with its client still
// there. Reading the deadline as the peer leaving answered such requests with an empty 200.
func TestPeerClosedIgnoresReadDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if err := server.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if PeerClosed(server) {
		t.Fatal("a live peer was reported closed because the read deadline had passed")
	}
	client.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !PeerClosed(server) {
		if time.Now().After(deadline) {
			t.Fatal("closed peer not detected past the read deadline")
		}
		time.Sleep(5 * time.Millisecond)
	}
	server.Close()
	if !PeerClosed(server) {
		t.Fatal("a closed conn must read as closed")
	}
}
