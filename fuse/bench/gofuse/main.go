// Command gofuse-loopback mounts a directory on another through
// github.com/hanwen/go-fuse/v2's loopback node: the baseline that shows
// what a Go FUSE binding costs by itself, against bazil.org/fuse in the
// MemoryFS mount. It lives in its own module so that the main module does
// not depend on go-fuse.
//
//	gofuse-loopback [-timeout 1s] ORIGINAL MOUNTPOINT
//
// It serves in the foreground until unmounted or signalled.
package main

import (
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
