package fsops

import (
	"log/slog"
	"syscall"

	"github.com/memoryfs/memfs/client"
)

// errnoOf maps err and logs it when it is an EIO, the errno that hides a
// cause a user cannot see otherwise.
func errnoOf(op string, err error) syscall.Errno {
	e := client.Errno(err)
	if e == syscall.EIO {
		slog.Warn("fuse: operation failed", "op", op, "err", err)
	}
	return e
}
