package chaos

import (
	"flag"
	"log/slog"
	"os"
	"testing"
)

// TestMain runs four clusters at a time unless -parallel says otherwise:
// the nodes mostly wait on fsync and timers, so two cores are far from
// busy with two.
func TestMain(m *testing.M) {
	flag.Parse()
	quietFsops()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "4")
	}
	os.Exit(m.Run())
}

// quietFsops keeps slog's default logger to errors: the FUSE layer the
// caching readers go through (fuse/fsops) logs every operation that fails
// with EIO at Warn, and under faults that is every timeout.
func quietFsops() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
}
