package fsops

import (
	"log/slog"
	"runtime/debug"
	"syscall"

	"github.com/memoryfs/memfs/client"
)

// guard ends every exported operation: it recovers from a panic (logging
// the stack, answering EIO) and logs the errors that mean the cluster
// misbehaved rather than that the caller asked for something impossible.
// Use as `defer guard(op, &errno)`.
func guard(op string, errno *syscall.Errno) {
	if r := recover(); r != nil {
		slog.Error("fuse: panic in operation", "op", op, "panic", r, "stack", string(debug.Stack()))
		*errno = syscall.EIO
	}
}

// errnoOf maps err and logs it when it is an EIO, the errno that hides a
// cause a user cannot see otherwise.
func errnoOf(op string, err error) syscall.Errno {
	e := client.Errno(err)
	if e == syscall.EIO {
		slog.Warn("fuse: operation failed", "op", op, "err", err)
	}
	return e
}
