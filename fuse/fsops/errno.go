package fsops

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"runtime/debug"
	"syscall"
)

// ToErrno is the one place where an error from the client becomes the
// errno a system call returns:
//
//   - nil is 0;
//   - a syscall.Errno anywhere in the chain is kept (the cluster reports
//     POSIX errnos end to end);
//   - an operation that ran out of its time limit is EIO: the cluster
//     could not be reached, and a program must see an error rather than
//     hang;
//   - a cancelled context is EINTR (the bazil adapter does not let the
//     kernel's interrupts cancel operations, see bazilfs.uninterrupted);
//   - the io/fs sentinel errors get their usual errnos;
//   - anything else is EIO.
func ToErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		if e == 0 {
			return syscall.EIO
		}
		return e
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.EIO
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, fs.ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, fs.ErrClosed):
		return syscall.EBADF
	}
	return syscall.EIO
}

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
	e := ToErrno(err)
	if e == syscall.EIO {
		slog.Warn("fuse: operation failed", "op", op, "err", err)
	}
	return e
}
