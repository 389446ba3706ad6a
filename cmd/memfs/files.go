package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/progress"
	pb "github.com/memoryfs/memfs/memfspb"
)

// newFileCmds builds the file commands.
func newFileCmds() []*cobra.Command {
	return []*cobra.Command{newLsCmd(), newStatCmd(), newCatCmd(), newPutCmd(), newGetCmd(),
		newMkdirCmd(), newRmCmd(), newMvCmd(), newLnCmd()}
}

// copyBuf is the size of the pieces get (and cat) read, one at a time:
// large enough that a piece is one streamed answer, small enough to keep
// memory flat. Put writes smaller pieces, several at once (putPiece).
const copyBuf = 8 << 20

func newLsCmd() *cobra.Command {
	var long bool
	cmd := &cobra.Command{
		Use:   "ls [-l] [PATH]",
		Short: "List a directory (default /)",
		Args:  cobra.MaximumNArgs(1),
		RunE: clientRun(func(_ context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			name := "/"
			if len(args) == 1 {
				name = args[0]
			}
			return list(cmd.OutOrStdout(), c, name, long)
		}),
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "show mode, links, owner, size and time")
	return cmd
}

func list(out io.Writer, c *client.Client, name string, long bool) error {
	fi, err := c.Lstat(name)
	if err != nil {
		return err
	}
	type row struct {
		name string
		fi   fs.FileInfo
	}
	var rows []row
	if fi.IsDir() {
		ents, err := c.ReadDir(name)
		if err != nil {
			return err
		}
		for _, e := range ents {
			row := row{name: e.Name()}
			if long {
				if row.fi, err = e.Info(); err != nil {
					return err
				}
			}
			rows = append(rows, row)
		}
	} else {
		rows = append(rows, row{name: name, fi: fi})
	}
	if !long {
		for _, r := range rows {
			fmt.Fprintln(out, r.name)
		}
		return nil
	}
	for _, r := range rows {
		a := r.fi.Sys().(*pb.Attr)
		target := ""
		if r.fi.Mode()&fs.ModeSymlink != 0 {
			p := r.name
			if fi.IsDir() {
				p = path.Join(name, r.name)
			}
			if t, err := c.Readlink(p); err == nil {
				target = " -> " + t
			}
		}
		size := fmt.Sprint(r.fi.Size())
		if r.fi.Mode()&fs.ModeDevice != 0 {
			size = fmt.Sprintf("%d, %d", unix.Major(a.Rdev), unix.Minor(a.Rdev))
		}
		fmt.Fprintf(out, "%s %3d %5d %5d %10s %s %s%s\n", lsMode(r.fi.Mode()), a.Nlink, a.Uid, a.Gid,
			size, r.fi.ModTime().Format("Jan _2 15:04"), r.name, target)
	}
	return nil
}

// lsMode writes a mode as ls -l does: the type letter, then rwx three
// times with s, S, t and T for the set-ID and sticky bits.
func lsMode(m fs.FileMode) string {
	b := []byte("-rwxrwxrwx")
	switch {
	case m.IsDir():
		b[0] = 'd'
	case m&fs.ModeSymlink != 0:
		b[0] = 'l'
	case m&fs.ModeNamedPipe != 0:
		b[0] = 'p'
	case m&fs.ModeSocket != 0:
		b[0] = 's'
	case m&fs.ModeCharDevice != 0:
		b[0] = 'c'
	case m&fs.ModeDevice != 0:
		b[0] = 'b'
	}
	for i := range 9 {
		if m&(1<<(8-i)) == 0 {
			b[1+i] = '-'
		}
	}
	special := func(i int, set bool, on, off byte) {
		if !set {
			return
		}
		if b[i] == 'x' {
			b[i] = on
		} else {
			b[i] = off
		}
	}
	special(3, m&fs.ModeSetuid != 0, 's', 'S')
	special(6, m&fs.ModeSetgid != 0, 's', 'S')
	special(9, m&fs.ModeSticky != 0, 't', 'T')
	return string(b)
}

func newStatCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stat PATH",
		Short: "Show a file's attributes (without following a final symlink)",
		Args:  cobra.ExactArgs(1),
		RunE: clientRun(func(_ context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			fi, err := c.Lstat(args[0])
			if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
				pe.Op = "stat"
			}
			if err != nil {
				return err
			}
			a := fi.Sys().(*pb.Attr)
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "  File: %s\n", args[0])
			fmt.Fprintf(out, "  Size: %-12d Blocks: %-8d %s\n", a.Size, a.Blocks, kind(fi.Mode()))
			fmt.Fprintf(out, " Inode: %-12d Links: %-8d Generation: %d\n", a.Ino, a.Nlink, a.Generation)
			fmt.Fprintf(out, "Access: (%04o/%s)  Uid: %d  Gid: %d\n", a.Mode&0o7777, fi.Mode(), a.Uid, a.Gid)
			for _, t := range []struct {
				name string
				ns   int64
			}{{"Access", a.AtimeNs}, {"Modify", a.MtimeNs}, {"Change", a.CtimeNs}} {
				fmt.Fprintf(out, "%s: %s\n", t.name, time.Unix(0, t.ns).Format("2006-01-02 15:04:05.000000000 -0700"))
			}
			return nil
		}),
	}
	return cmd
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m.IsRegular():
		return "regular file"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character special file"
	case m&fs.ModeDevice != 0:
		return "block special file"
	}
	return "other"
}

func newCatCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cat PATH...",
		Short: "Print files to standard output",
		Args:  cobra.MinimumNArgs(1),
		RunE: clientRun(func(_ context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			for _, name := range args {
				if err := getTo(cmd.OutOrStdout(), c, name); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	return cmd
}

// getTo copies remote file name to w.
func getTo(w io.Writer, c *client.Client, name string) error {
	f, err := c.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyBuffer(onlyWriter{w}, onlyReader{f}, make([]byte, copyBuf)); err != nil {
		return err
	}
	return f.Close()
}

// onlyReader and onlyWriter hide ReaderFrom/WriterTo so that io.CopyBuffer
// uses our buffer size.
type onlyReader struct{ io.Reader }
type onlyWriter struct{ io.Writer }

func newPutCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "put LOCAL REMOTE",
		Short: "Copy a local file (or - for standard input) into the cluster",
		Long: `Copy a local file (or - for standard input) into the cluster. If REMOTE is
an existing directory the file keeps its name inside it. The file goes in
pieces of 1 MiB, 16 in flight; --timeout bounds the wait for each piece,
not the whole copy. The data goes to a hidden temporary file
beside REMOTE that is renamed over it at the end, so a failed or
interrupted copy leaves REMOTE as it was.`,
		Args: cobra.ExactArgs(2),
		RunE: clientRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			local, remote := args[0], args[1]
			var in io.Reader = cmd.InOrStdin()
			size := int64(-1)
			if local != "-" {
				f, err := os.Open(local)
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
				if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
					size = fi.Size()
				}
				if fi, err := c.Stat(remote); err == nil && fi.IsDir() {
					remote = path.Join(remote, path.Base(local))
				}
			}
			bar := progress.Bytes(cmd.ErrOrStderr(), size, "put "+remote, global.quiet)
			return putStream(ctx, c, in, remote, bar)
		}),
	}
	return cmd
}

func newGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get REMOTE LOCAL",
		Short: "Copy a file out of the cluster (LOCAL - for standard output)",
		Long: `Copy a file out of the cluster (LOCAL - for standard output). If LOCAL is an
existing directory the file keeps its name inside it. --timeout bounds the
wait for each piece, not the whole copy. The data goes to a hidden temporary
file beside LOCAL that is synced and renamed over it at the end, so a failed
or interrupted copy leaves LOCAL as it was.`,
		Args: cobra.ExactArgs(2),
		RunE: clientRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			remote, local := args[0], args[1]
			if local == "-" {
				return getTo(cmd.OutOrStdout(), c, remote)
			}
			if fi, err := os.Stat(local); err == nil && fi.IsDir() {
				local = filepath.Join(local, path.Base(remote))
			}
			return getFile(ctx, c, remote, local, func(size int64) *progress.Bar {
				return progress.Bytes(cmd.ErrOrStderr(), size, "get "+remote, global.quiet)
			})
		}),
	}
	return cmd
}

func newMkdirCmd() *cobra.Command {
	var parents bool
	cmd := &cobra.Command{
		Use:   "mkdir [-p] PATH...",
		Short: "Create directories",
		Args:  cobra.MinimumNArgs(1),
		RunE: clientRun(func(_ context.Context, _ *cobra.Command, c *client.Client, args []string) error {
			for _, name := range args {
				mk := c.Mkdir
				if parents {
					mk = c.MkdirAll
				}
				if err := mk(name, 0o755); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "create missing parents; no error if it exists")
	return cmd
}

func newRmCmd() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm [-r] PATH...",
		Short: "Remove files, symlinks and empty directories (-r: whole trees)",
		Args:  cobra.MinimumNArgs(1),
		RunE: clientRun(func(_ context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			for _, name := range args {
				if recursive {
					// Like rm -r, a missing path is an error.
					if _, err := c.Lstat(name); err != nil {
						return err
					}
					bar := rmBar(c, cmd.ErrOrStderr(), name)
					if err := c.RemoveAllFunc(name, func(string) { bar.Add(1) }); err != nil {
						bar.Stop()
						return err
					}
					bar.Finish()
					continue
				}
				if err := c.Remove(name); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	return cmd
}

// rmBar is the progress bar of rm -r name: on a terminal the entries of
// the tree are counted first (reads, cheap beside the removals, each a
// committed command), so the bar has an end and a time left; when the
// count fails the bar counts without an end.
func rmBar(c *client.Client, w io.Writer, name string) *progress.Bar {
	if global.quiet || !progress.IsTerminal(w) {
		return nil
	}
	n, err := countTree(c, name)
	if err != nil {
		return progress.Items(w, "rm -r "+name, "entries", global.quiet)
	}
	return progress.ItemsOf(w, n, "rm -r "+name, "entries", global.quiet)
}

// countTree counts name and, for a directory, every entry below it.
func countTree(c *client.Client, name string) (int64, error) {
	fi, err := c.Lstat(name)
	if err != nil || !fi.IsDir() {
		return 1, err
	}
	ents, err := c.ReadDir(name)
	if err != nil {
		return 0, err
	}
	n := int64(1)
	for _, e := range ents {
		if !e.IsDir() {
			n++
			continue
		}
		sub, err := countTree(c, path.Join(name, e.Name()))
		if err != nil {
			return 0, err
		}
		n += sub
	}
	return n, nil
}

func newMvCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mv SRC DST",
		Short: "Rename or move a file or directory (into DST if it is a directory)",
		Args:  cobra.ExactArgs(2),
		RunE: clientRun(func(_ context.Context, _ *cobra.Command, c *client.Client, args []string) error {
			src, dst := args[0], args[1]
			if fi, err := c.Stat(dst); err == nil && fi.IsDir() {
				dst = path.Join(dst, path.Base(src))
			}
			return c.Rename(src, dst)
		}),
	}
	return cmd
}

func newLnCmd() *cobra.Command {
	var symbolic bool
	cmd := &cobra.Command{
		Use:   "ln [-s] TARGET LINK",
		Short: "Create a hard link (or with -s a symbolic link) LINK to TARGET",
		Args:  cobra.ExactArgs(2),
		RunE: clientRun(func(_ context.Context, _ *cobra.Command, c *client.Client, args []string) error {
			if symbolic {
				return c.Symlink(args[0], args[1])
			}
			return c.Link(args[0], args[1])
		}),
	}
	cmd.Flags().BoolVarP(&symbolic, "symbolic", "s", false, "make a symbolic link")
	return cmd
}
