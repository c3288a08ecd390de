// Package fdlimit keeps a server alive at the file-descriptor limit: it raises the soft
// limit to the hard one, sizes connection caps below it, and makes running out a pause in
// accepting rather than the end of the server.
package fdlimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Raise lifts the soft RLIMIT_NOFILE to the hard limit (a default soft limit of 1,024 is
// what an idle-connection flood exhausts first) and returns the soft limit now in effect.
func Raise() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit nofile: %w", err)
	}
	if lim.Cur < lim.Max {
		want := lim
		want.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			return lim.Cur, fmt.Errorf("setrlimit nofile %d: %w", want.Cur, err)
		}
		lim = want
	}
	return lim.Cur, nil
}

// ClientBudget is how many client connections a proxy may hold under a descriptor limit:
// each may need an upstream connection too, and a reserve stays for listeners, probes,
// metrics scrapes, replicas' pipes and the state file.
func ClientBudget(limit uint64) int {
	reserve := 64 + limit/16
	if limit <= reserve {
		return 1
	}
	return int(min((limit-reserve)/2, 1<<30))
}

// Listener returns ln with Accept waiting out a shortage of file descriptors (EMFILE,
// ENFILE: they free as connections close) instead of failing, which ends a fasthttp
// server. log hears of each shortage once, when it starts.
func Listener(ln net.Listener, log *slog.Logger) net.Listener {
	return &patientListener{Listener: ln, log: log}
}

type patientListener struct {
	net.Listener
	log   *slog.Logger
	short atomic.Bool // a shortage is on (reported when it starts and when it ends)
}

func (l *patientListener) Accept() (net.Conn, error) {
	delay := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if l.short.Swap(false) {
				l.log.Info("file descriptors available again; accepting", "addr", l.Addr().String())
			}
			return c, nil
		}
		if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) {
			return nil, err
		}
		if !l.short.Swap(true) {
			l.log.Warn("out of file descriptors: new connections wait until some close", "addr", l.Addr().String(), "err", err)
		}
		time.Sleep(delay)
		delay = min(2*delay, time.Second)
	}
}
