// Command gofuse-loopback mounts a directory on another through
// github.com/hanwen/go-fuse/v2's loopback node: the baseline that shows
// what a Go FUSE binding costs by itself, with nothing behind it but
// tmpfs, against the MemoryFS mount's two bindings (fuse/bench/fio.sh).
//
//	gofuse-loopback [-timeout 1s] ORIGINAL MOUNTPOINT
//
// It serves in the foreground until unmounted or signalled.
//
// go-fuse hands an open loopback file to the kernel as a FUSE passthrough
// backing file when it can (root, Linux 6.9+): reads and writes then never
// reach the Go process and the figures are the kernel's, not the binding's.
// That is off unless -passthrough is given.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	timeout := flag.Duration("timeout", time.Second, "attribute and entry cache timeout (the MemoryFS mount's default)")
	debug := flag.Bool("debug", false, "trace every request")
	passthrough := flag.Bool("passthrough", false, "let the kernel read and write the backing files directly (FUSE passthrough)")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: gofuse-loopback [-timeout 1s] ORIGINAL MOUNTPOINT")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if !*passthrough {
		root = withoutPassthrough(root)
	}
	srv, err := fs.Mount(flag.Arg(1), root, &fs.Options{
		AttrTimeout:  timeout,
		EntryTimeout: timeout,
		MountOptions: fuse.MountOptions{
			FsName: "gofuse-loopback",
			Name:   "loopback",
			Debug:  *debug,
			// The largest request the kernel accepts (go-fuse caps it
			// at 1 MiB); same setting as passthrough_ll gets by default.
			MaxWrite: 1 << 20,
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		_ = srv.Unmount()
	}()
	srv.Wait()
}

// withoutPassthrough makes every node of the loopback tree rooted at root a
// node whose open files do not offer a passthrough descriptor.
func withoutPassthrough(root fs.InodeEmbedder) fs.InodeEmbedder {
	lr := root.(*fs.LoopbackNode).RootData
	lr.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{fs.LoopbackNode{RootData: r}}
	}
	n := &node{fs.LoopbackNode{RootData: lr}}
	lr.RootNode = n
	return n
}

// node is a loopback node whose files hide LoopbackFile.PassthroughFd.
type node struct{ fs.LoopbackNode }

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, e := n.LoopbackNode.Open(ctx, flags)
	return wrap(fh), fl, e
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, e := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, wrap(fh), fl, e
}

// fileOps is what a LoopbackFile does, less PassthroughFd.
type fileOps interface {
	fs.FileReader
	fs.FileWriter
	fs.FileFlusher
	fs.FileFsyncer
	fs.FileReleaser
	fs.FileGetattrer
	fs.FileSetattrer
	fs.FileLseeker
	fs.FileAllocater
	fs.FileGetlker
	fs.FileSetlker
	fs.FileSetlkwer
}

type plainFile struct{ fileOps }

func wrap(fh fs.FileHandle) fs.FileHandle {
	if f, ok := fh.(fileOps); ok {
		return plainFile{f}
	}
	return fh
}
