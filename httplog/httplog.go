// Package httplog routes fasthttp's connection-level messages (a client that reset its
// connection, a malformed request) into structured logs at debug level: they are routine
// for a proxy and would otherwise flood stderr through the standard logger.
package httplog

import (
	"fmt"
	"log/slog"
)

// Fasthttp adapts l to fasthttp.Logger.
type Fasthttp struct{ L *slog.Logger }

// Printf implements fasthttp.Logger.
func (f Fasthttp) Printf(format string, args ...any) {
	f.L.Debug(fmt.Sprintf(format, args...), "source", "fasthttp")
}
