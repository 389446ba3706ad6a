package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// raftLogger routes hashicorp/raft's hclog output into slog at or above
// level (an hclog level name; "warn" when empty).
func raftLogger(log *slog.Logger, level string) hclog.Logger {
	if level == "" {
		level = "warn"
	}
	lvl := hclog.LevelFromString(level)
	if lvl == hclog.NoLevel {
		lvl = hclog.Warn
	}
	l := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "raft", Level: hclog.Off, Output: io.Discard})
	l.RegisterSink(&slogSink{log: log, level: lvl})
	return l
}

// slogSink receives every hclog message and forwards those at or above
// level.
type slogSink struct {
	log   *slog.Logger
	level hclog.Level
}

func (s *slogSink) Accept(name string, level hclog.Level, msg string, args ...any) {
	if s.level == hclog.Off || level < s.level {
		return
	}
	var sl slog.Level
	switch {
	case level >= hclog.Error:
		sl = slog.LevelError
	case level == hclog.Warn:
		sl = slog.LevelWarn
	case level == hclog.Info:
		sl = slog.LevelInfo
	default:
		sl = slog.LevelDebug
	}
	attrs := make([]any, 0, len(args)+2)
	attrs = append(attrs, "component", name)
	for i := 0; i+1 < len(args); i += 2 {
		attrs = append(attrs, fmt.Sprint(args[i]), args[i+1])
	}
	s.log.Log(context.Background(), sl, strings.TrimSpace(msg), attrs...)
}
