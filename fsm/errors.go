package fsm

import (
	"errors"
	"fmt"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Error is a failed command or query: a Linux errno and a message for
// humans. It unwraps to the syscall.Errno, so errors.Is(err, fs.ErrNotExist)
// and errors.Is(err, syscall.ENOENT) both work.
type Error struct {
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Errno.Error()
	}
	return e.Msg + ": " + e.Errno.Error()
}

// Unwrap returns the errno.
func (e *Error) Unwrap() error { return e.Errno }

// errf builds an *Error; the message names the operation and the object.
func errf(errno syscall.Errno, format string, args ...any) error {
	return &Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// ResultError returns nil for a successful result and an *Error for a
// failed one.
func ResultError(r *pb.Result) error {
	if r == nil {
		return &Error{Errno: syscall.EIO, Msg: "no result"}
	}
	if r.Errno == 0 {
		return nil
	}
	return &Error{Errno: syscall.Errno(r.Errno), Msg: r.Message}
}

// errResult turns err into a result. An error without an errno (a bug) is
// reported as EIO rather than lost.
func errResult(err error) *pb.Result {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = syscall.EIO
	}
	msg := err.Error()
	if e, ok := err.(*Error); ok && e.Msg != "" {
		msg = e.Msg // ResultError adds the errno's text back
	}
	return &pb.Result{Errno: uint32(errno), Message: msg}
}
