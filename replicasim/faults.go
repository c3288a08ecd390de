package replicasim

import (
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/oai"
)

// Fault kinds a test can inject.
const (
	FaultNone = ""
	// FaultReset resets the connection before any response byte.
	FaultReset = "reset"
	// FaultStatus answers Status (default 503) with an OpenAI error body.
	FaultStatus = "status"
	// FaultHang never answers (until HangFor, default 10 min, or shutdown).
	FaultHang = "hang"
	// FaultDieMidStream aborts the connection after AfterTokens tokens, as a dying replica does.
	FaultDieMidStream = "die_mid_stream"
	// FaultCrash exits the whole process after AfterTokens tokens.
	FaultCrash = "crash"
	// FaultGarbage answers bytes that are not HTTP.
	FaultGarbage = "garbage"
	// FaultSlow multiplies every engine step by Slowdown (all requests, until cleared).
	FaultSlow = "slow"
)

// Fault is one injected misbehaviour.
type Fault struct {
	Kind string `json:"kind"`
	// Count applies the fault to the next Count requests; 0 means every request until cleared.
	Count       int           `json:"count,omitempty"`
	AfterTokens int           `json:"after_tokens,omitempty"`
	Status      int           `json:"status,omitempty"`
	Slowdown    float64       `json:"slowdown,omitempty"`
	HangFor     time.Duration `json:"hang_for,omitempty"`
}

// Validate checks a fault's fields.
func (f *Fault) Validate() error {
	switch f.Kind {
	case FaultNone, FaultReset, FaultHang, FaultDieMidStream, FaultCrash, FaultGarbage:
	case FaultStatus:
		if f.Status == 0 {
			f.Status = fasthttp.StatusServiceUnavailable
		}
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("fault status %d: want 400-599", f.Status)
		}
	case FaultSlow:
		if f.Slowdown < 1 {
			return fmt.Errorf("fault slowdown %v: want >= 1", f.Slowdown)
		}
	default:
		return fmt.Errorf("unknown fault kind %q: want reset, status, hang, die_mid_stream, crash, garbage or slow", f.Kind)
	}
	if f.Count < 0 || f.AfterTokens < 0 {
		return fmt.Errorf("fault count and after_tokens must be >= 0")
	}
	return nil
}

type faultState struct {
	mu    sync.Mutex
	f     Fault
	left  int
	armed bool
}

func (fs *faultState) set(f Fault) {
	fs.mu.Lock()
	fs.f, fs.left, fs.armed = f, f.Count, f.Kind != FaultNone
	fs.mu.Unlock()
}

// take returns the fault for the next request, counting it down.
func (fs *faultState) take() Fault {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !fs.armed || fs.f.Kind == FaultSlow {
		return Fault{}
	}
	f := fs.f
	if fs.f.Count > 0 {
		fs.left--
		if fs.left <= 0 {
			fs.armed = false
		}
	}
	return f
}

// SetFault installs a fault (also reachable as POST /admin/fault).
func (s *Server) SetFault(f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	s.faults.set(f)
	if s.drv != nil {
		slow := 1.0
		if f.Kind == FaultSlow {
			slow = f.Slowdown
		}
		s.drv.setSlowdown(slow)
	}
	return nil
}

// preFault applies faults that strike before the first response byte; it reports whether
// the request was consumed.
func (s *Server) preFault(ctx *fasthttp.RequestCtx, f Fault) bool {
	switch f.Kind {
	case FaultReset:
		resetConn(ctx.Conn())
		return true
	case FaultStatus:
		oai.WriteError(ctx, f.Status, oai.ServerError, "injected fault")
		return true
	case FaultHang:
		d := f.HangFor
		if d <= 0 {
			d = 10 * time.Minute
		}
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) && !clientGone(ctx.Conn()) {
			time.Sleep(50 * time.Millisecond)
		}
		oai.WriteError(ctx, fasthttp.StatusGatewayTimeout, oai.Timeout, "injected hang ended")
		return true
	case FaultGarbage:
		ctx.Hijack(func(c net.Conn) {
			_, _ = c.Write([]byte("\x00\x01garbage that is not HTTP\r\n\r\n"))
		})
		return true
	}
	return false
}

// die ends a response abruptly: a reset connection, or the whole process for FaultCrash.
func (s *Server) die(c net.Conn, f Fault) {
	if f.Kind == FaultCrash {
		s.cfg.Logger.Warn("injected crash")
		s.cfg.Exit(1)
	}
	resetConn(c)
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // RST instead of FIN, like a killed process's kernel would not; harsher
	}
	_ = c.Close()
}

// admin serves the fault, health and preemption endpoints used by tests and providers.
func (s *Server) admin(ctx *fasthttp.RequestCtx, path string) {
	switch {
	case path == "/admin/fault" && ctx.IsDelete():
		_ = s.SetFault(Fault{})
	case path == "/admin/fault" && ctx.IsPost():
		var f Fault
		if err := json.Unmarshal(ctx.PostBody(), &f); err != nil {
			oai.WriteError(ctx, fasthttp.StatusBadRequest, oai.InvalidRequest, "fault: "+err.Error())
			return
		}
		if err := s.SetFault(f); err != nil {
			oai.WriteError(ctx, fasthttp.StatusBadRequest, oai.InvalidRequest, err.Error())
			return
		}
	case path == "/admin/health" && ctx.IsPost():
		var h struct {
			Healthy bool `json:"healthy"`
		}
		if err := json.Unmarshal(ctx.PostBody(), &h); err != nil {
			oai.WriteError(ctx, fasthttp.StatusBadRequest, oai.InvalidRequest, "health: "+err.Error())
			return
		}
		s.mu.Lock()
		s.unhealthy = !h.Healthy
		s.mu.Unlock()
	case path == "/admin/preempt" && ctx.IsPost():
		var p struct {
			NoticeSeconds float64 `json:"notice_seconds"`
		}
		if err := json.Unmarshal(ctx.PostBody(), &p); err != nil || p.NoticeSeconds < 0 {
			oai.WriteError(ctx, fasthttp.StatusBadRequest, oai.InvalidRequest, "preempt: want {\"notice_seconds\": N >= 0}")
			return
		}
		s.Preempt(time.Duration(p.NoticeSeconds * float64(time.Second)))
	case path == "/admin/preemption" && ctx.IsGet():
		// Shaped like AWS's spot/instance-action metadata: 404 until a notice exists.
		s.mu.Lock()
		at := s.preemptAt
		s.mu.Unlock()
		if at.IsZero() {
			oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, "no preemption notice")
			return
		}
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"action":"terminate","time":%q}`, at.UTC().Format(time.RFC3339Nano))
	default:
		oai.WriteError(ctx, fasthttp.StatusMethodNotAllowed, oai.InvalidRequest, "method not allowed on "+path)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// Preempt publishes a preemption notice and ends the process when it expires, as a cloud
// reclaiming a spot VM does.
func (s *Server) Preempt(notice time.Duration) {
	s.mu.Lock()
	s.preemptAt = time.Now().Add(notice)
	s.mu.Unlock()
	s.cfg.Logger.Warn("preemption notice", "terminate_in", notice)
	time.AfterFunc(notice, func() {
		s.cfg.Logger.Warn("preempted: terminating")
		s.cfg.Exit(0)
	})
}
