package client

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"

	pb "github.com/memoryfs/memfs/proto"
)

// errnoErr returns the errno of a failed result as an error. Errno values
// on the wire are Linux's, which syscall.Errno is on Linux.
func errnoErr(res *pb.Result) error {
	if res.GetErrno() == 0 {
		return nil
	}
	return syscall.Errno(res.GetErrno())
}

// pathErr wraps err (nil stays nil) with the operation and the path, as
// the os package does, so errors.Is(err, fs.ErrNotExist) and friends work.
func pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

func linkErr(op, oldname, newname string, err error) error {
	if err == nil {
		return nil
	}
	return &os.LinkError{Op: op, Old: oldname, New: newname, Err: err}
}

// Errno returns the POSIX error number an error from this package stands
// for, for callers that must answer with one (a FUSE file system): the
// errno a node returned, EINTR for a cancelled call, ETIMEDOUT for one that
// ran out of time, EIO for anything else. It returns 0 for a nil error.
func Errno(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, fs.ErrClosed):
		return syscall.EBADF
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	}
	return syscall.EIO
}

// locName describes a Loc for error messages: its path, or "#parent/name",
// or "#ino".
func locName(l *pb.Loc) string {
	switch {
	case l.GetPath() != "":
		return l.GetPath()
	case l.GetName() != "":
		return "#" + strconv.FormatUint(l.GetParent(), 10) + "/" + l.GetName()
	default:
		return "#" + strconv.FormatUint(l.GetIno(), 10)
	}
}

// opName names a command for error messages and logs.
func opName(cmd *pb.Command) string {
	switch cmd.GetOp().(type) {
	case *pb.Command_Open:
		return "open"
	case *pb.Command_Close:
		return "close"
	case *pb.Command_Write:
		return "write"
	case *pb.Command_Mkdir:
		return "mkdir"
	case *pb.Command_Remove:
		return "remove"
	case *pb.Command_Rename:
		return "rename"
	case *pb.Command_SetAttr:
		return "setattr"
	case *pb.Command_Symlink:
		return "symlink"
	case *pb.Command_Link:
		return "link"
	case *pb.Command_SetXattr:
		return "setxattr"
	case *pb.Command_RemoveXattr:
		return "removexattr"
	case *pb.Command_Clone:
		return "clone"
	case *pb.Command_OpenSession:
		return "open session"
	case *pb.Command_KeepAlive:
		return "keepalive"
	case *pb.Command_CloseSession:
		return "close session"
	case *pb.Command_Mknod:
		return "mknod"
	case *pb.Command_Grant:
		return "grant"
	case *pb.Command_Release:
		return "release"
	case *pb.Command_ReserveInodes:
		return "reserve inodes"
	case *pb.Command_Batch:
		return "batch"
	case *pb.Command_Touch:
		return "touch"
	case *pb.Command_Lock:
		return "lock"
	case *pb.Command_TokenCreate:
		return "token create"
	case *pb.Command_TokenRevoke:
		return "token revoke"
	}
	return "command"
}

// cmdLoc returns the file a command is about, for error messages.
func cmdLoc(cmd *pb.Command) *pb.Loc {
	switch op := cmd.GetOp().(type) {
	case *pb.Command_Open:
		return op.Open.GetLoc()
	case *pb.Command_Write:
		return op.Write.GetLoc()
	case *pb.Command_Mkdir:
		return op.Mkdir.GetLoc()
	case *pb.Command_Remove:
		return op.Remove.GetLoc()
	case *pb.Command_Rename:
		return op.Rename.GetSrc()
	case *pb.Command_SetAttr:
		return op.SetAttr.GetLoc()
	case *pb.Command_Symlink:
		return op.Symlink.GetLoc()
	case *pb.Command_Link:
		return op.Link.GetDst()
	case *pb.Command_SetXattr:
		return op.SetXattr.GetLoc()
	case *pb.Command_RemoveXattr:
		return op.RemoveXattr.GetLoc()
	case *pb.Command_Clone:
		return op.Clone.GetDst()
	case *pb.Command_Lock:
		return &pb.Loc{Ino: op.Lock.GetIno()}
	}
	return nil
}

func queryName(q *pb.Query) (string, *pb.Loc) {
	switch v := q.GetQ().(type) {
	case *pb.Query_Stat:
		return "stat", v.Stat.GetLoc()
	case *pb.Query_Read:
		return "read", v.Read.GetLoc()
	case *pb.Query_ReadDir:
		return "readdir", v.ReadDir.GetLoc()
	case *pb.Query_Readlink:
		return "readlink", v.Readlink.GetLoc()
	case *pb.Query_GetXattr:
		return "getxattr", v.GetXattr.GetLoc()
	case *pb.Query_ListXattr:
		return "listxattr", v.ListXattr.GetLoc()
	case *pb.Query_Statfs:
		return "statfs", nil
	case *pb.Query_Handle:
		return "wait", nil
	case *pb.Query_Usage:
		return "usage", v.Usage.GetLoc()
	case *pb.Query_Lock:
		return "getlk", &pb.Loc{Ino: v.Lock.GetIno()}
	case *pb.Query_Seek:
		return "lseek", v.Seek.GetLoc()
	}
	return "query", nil
}
