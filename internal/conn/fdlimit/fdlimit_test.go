package fdlimit

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
)

// flakyListener fails its first n accepts with err, then accepts from the real one.
type flakyListener struct {
	net.Listener
	n   int
	err error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.n > 0 {
		l.n--
		return nil, l.err
	}
	return l.Listener.Accept()
}

// Running out of descriptors pauses accepting; any other error still ends it.
func TestListenerWaitsOutADescriptorShortage(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	pl := Listener(&flakyListener{Listener: ln, n: 3, err: emfile}, slog.New(slog.DiscardHandler))
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			defer c.Close()
		}
	}()
	c, err := pl.Accept()
	if err != nil {
		t.Fatalf("accept after three EMFILE: %v", err)
	}
	c.Close()
	other := errors.New("listener broken")
	if _, err := Listener(&flakyListener{Listener: ln, n: 1, err: other}, slog.New(slog.DiscardHandler)).Accept(); !errors.Is(err, other) {
		t.Fatalf("another error: %v; want it returned", err)
	}
}

func TestClientBudgetLeavesAReserve(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		want  int
	}{{1024, 448}, {256, 88}, {64, 1}, {1 << 20, 491488}} {
		if got := ClientBudget(tc.limit); got != tc.want {
			t.Errorf("ClientBudget(%d) = %d; want %d", tc.limit, got, tc.want)
		}
	}
	if lim, err := Raise(); err != nil || lim == 0 {
		t.Fatalf("Raise: %d, %v", lim, err)
	}
}
