// Package httplog builds the programs' loggers and routes fasthttp's connection-level messages (a client that reset its
// connection, a malformed request) into structured logs at debug level: they are routine
// for a proxy and would otherwise flood stderr through the standard logger.
package httplog

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// Fasthttp adapts l to fasthttp.Logger.
type Fasthttp struct{ L *slog.Logger }

// Printf implements fasthttp.Logger.
func (f Fasthttp) Printf(format string, args ...any) {
	// fasthttp calls this on hot paths too (Request.Body on a streamed body warns every
	// time): format nothing unless it will be written.
	if !f.L.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	f.L.Debug(fmt.Sprintf(format, args...), "source", "fasthttp")
}

// NewLogger returns a text logger on stderr at the named level (debug, info, warn, error).
func NewLogger(level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}
