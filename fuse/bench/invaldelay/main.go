// Command invaldelay measures how soon a change made elsewhere in the
// cluster is seen through a MemoryFS mount: the delay of the pushed kernel
// cache invalidations (docs/fuse.md).
//
//	go run ./fuse/bench/invaldelay --cluster ADDRS --mount DIR [--via DIR2] [--changes 300]
//
// For each change it first reads through DIR so that the kernel caches the
// file's page and the name, then changes the file through the client
// library (or, with --via, through a second mount DIR2 of the same
// cluster), and from the moment the change is committed polls DIR every
// 100 µs until the change shows. Two kinds of change are measured:
//
//   - data: the file's first bytes are overwritten (same size, so only
//     the page cache is stale); polled with pread on a descriptor held
//     open, which the kernel answers from its page cache until the
//     invalidation arrives;
//   - unlink: a file is removed; polled with lstat, which the kernel
//     answers from its name cache until the invalidation arrives.
//
// Everything a mount caches lives up to --attr-timeout (1 s by default), so
// a delay well under that is the push; one at the timeout means the push
// was missed.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/tlsconf"
)

const pollEvery = 100 * time.Microsecond

func main() {
	addrs := flag.String("cluster", os.Getenv("MEMFS_CLUSTER"), "comma-separated API addresses")
	mnt := flag.String("mount", "", "the mount that observes the changes")
	via := flag.String("via", "", "make the changes through this second mount instead of the client library")
	n := flag.Int("changes", 300, "changes of each kind")
	limit := flag.Duration("limit", 10*time.Second, "give up on one change after this long")
	flag.Parse()
	if *mnt == "" || *addrs == "" {
		fmt.Fprintln(os.Stderr, "usage: invaldelay --cluster ADDRS --mount DIR [--via DIR2] [--changes N]")
		os.Exit(2)
	}
	if err := run(strings.Split(*addrs, ","), *mnt, *via, *n, *limit); err != nil {
		fmt.Fprintln(os.Stderr, "invaldelay:", err)
		os.Exit(1)
	}
}

// changer makes changes to the files of the test directory elsewhere than
// the observing mount.
type changer interface {
	overwrite(name string, data []byte) error
	remove(name string) error
}

type viaClient struct{ c *client.Client }

func (v viaClient) overwrite(name string, data []byte) error {
	f, err := v.c.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		return err
	}
	return f.Sync()
}

func (v viaClient) remove(name string) error { return v.c.Remove(name) }

type viaMount struct{ dir string }

func (v viaMount) overwrite(name string, data []byte) error {
	f, err := os.OpenFile(filepath.Join(v.dir, name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		return err
	}
	// fsync returns once the write is committed.
	return f.Sync()
}

func (v viaMount) remove(name string) error { return os.Remove(filepath.Join(v.dir, name)) }

func run(addrs []string, mnt, via string, n int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []client.Option{client.WithName("invaldelay")}
	if ca := os.Getenv("MEMFS_CA"); ca != "" {
		// The cluster's TLS files, as memfs up prints them.
		src, err := tlsconf.Load(tlsconf.Files{CA: ca, Cert: os.Getenv("MEMFS_CERT"), Key: os.Getenv("MEMFS_KEY")}, nil)
		if err != nil {
			return err
		}
		opts = append(opts, client.WithTLS(src.ClientConfig()))
	}
	c, err := client.New(ctx, addrs, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	dir := fmt.Sprintf("/.invaldelay-%d", os.Getpid())
	if err := c.Mkdir(dir, 0o755); err != nil {
		return err
	}
	defer func() { _ = c.RemoveAll(dir) }()
	var ch changer = viaClient{c}
	how := "the client library"
	if via != "" {
		ch, how = viaMount{via}, "a second mount ("+via+")"
	}
	rel := func(name string) string {
		if via != "" {
			return strings.TrimPrefix(dir, "/") + "/" + name
		}
		return dir + "/" + name
	}
	local := func(name string) string { return filepath.Join(mnt, dir, name) }

	// data: one file, overwritten n times.
	if err := c.WriteFile(dir+"/data", []byte("version 00000"), 0o644); err != nil {
		return err
	}
	f, err := openWhenSeen(local("data"), limit)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 64)
	var data []time.Duration
	for i := 1; i <= n; i++ {
		if _, err := f.ReadAt(buf[:13], 0); err != nil {
			return fmt.Errorf("read through the mount: %w", err)
		}
		want := []byte(fmt.Sprintf("version %05d", i))
		if err := ch.overwrite(rel("data"), want); err != nil {
			return fmt.Errorf("change %d: %w", i, err)
		}
		d, err := pollUntil(limit, func() bool {
			m, err := f.ReadAt(buf[:13], 0)
			return err == nil && m == 13 && bytes.Equal(buf[:13], want)
		})
		if err != nil {
			return fmt.Errorf("data change %d: %w", i, err)
		}
		data = append(data, d)
	}

	// unlink: n files, each looked up through the mount, then removed.
	var unlink []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("u%05d", i)
		if err := c.WriteFile(dir+"/"+name, nil, 0o644); err != nil {
			return err
		}
		if _, err := pollUntil(limit, func() bool { _, err := os.Lstat(local(name)); return err == nil }); err != nil {
			return fmt.Errorf("%s never appeared on the mount: %w", name, err)
		}
		if err := ch.remove(rel(name)); err != nil {
			return fmt.Errorf("remove %s: %w", name, err)
		}
		d, err := pollUntil(limit, func() bool {
			_, err := os.Lstat(local(name))
			return errors.Is(err, fs.ErrNotExist)
		})
		if err != nil {
			return fmt.Errorf("unlink %d: %w", i, err)
		}
		unlink = append(unlink, d)
	}
	fmt.Printf("Invalidation delay, change made through %s, seen through %s (poll every %v):\n\n", how, mnt, pollEvery)
	fmt.Println("| change | n | p50 | p90 | p99 | max |")
	fmt.Println("|---|---|---|---|---|---|")
	report("data overwrite (pread from page cache)", data)
	report("unlink (lstat from name cache)", unlink)
	return nil
}

func openWhenSeen(p string, limit time.Duration) (*os.File, error) {
	var f *os.File
	_, err := pollUntil(limit, func() bool {
		var err error
		f, err = os.Open(p)
		return err == nil
	})
	return f, err
}

// pollUntil checks cond every pollEvery and returns how long it took to
// become true.
func pollUntil(limit time.Duration, cond func() bool) (time.Duration, error) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			return 0, fmt.Errorf("not seen within %v", limit)
		}
		time.Sleep(pollEvery)
	}
	return time.Since(start), nil
}

func report(what string, ds []time.Duration) {
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	r := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	fmt.Printf("| %s | %d | %s | %s | %s | %s |\n", what, len(ds), r(q(0.5)), r(q(0.9)), r(q(0.99)), r(ds[len(ds)-1]))
}
