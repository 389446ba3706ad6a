package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/memoryfs/memfs/client/replace"
	"github.com/memoryfs/memfs/internal/progress"
)

// The `memfs node replace` command: client/replace does the work; this
// file draws its progress and prints its summary.

// progressLine draws the catch-up progress on stderr: one refreshed line
// on a terminal, a line every 2 s in a log file, none with --quiet.
type progressLine struct {
	w        io.Writer
	tty      bool
	quiet    bool
	id       string
	now      func() time.Time
	lastLine time.Time
	lineOpen bool
}

func newProgressLine(w io.Writer, id string) *progressLine {
	return &progressLine{w: w, id: id, now: time.Now, tty: progress.IsTerminal(w), quiet: quietFlag}
}

// show draws the progress line: log position and lag, and block sync
// counts once the node reports them.
func (p *progressLine) show(pr replace.Progress) {
	if p.quiet {
		return
	}
	now := p.now()
	if !p.tty && now.Sub(p.lastLine) < 2*time.Second {
		return // a log file gets a line every 2 s, not a flood
	}
	p.lastLine = now
	self := pr.Self
	var b strings.Builder
	fmt.Fprintf(&b, "%s catching up: log %d/%d (lag %d)", p.id, self.AppliedIndex, pr.Commit, pr.Lag)
	if self.SyncBlocksWanted > 0 || self.SyncBytesWanted > 0 {
		fmt.Fprintf(&b, ", blocks %d/%d, %s/%s %s", self.SyncBlocksFetched, self.SyncBlocksWanted,
			humanBytes(self.SyncBytesFetched), humanBytes(self.SyncBytesWanted),
			bar(self.SyncBytesFetched, self.SyncBytesWanted, 20))
	}
	if self.Restoring {
		b.WriteString(", restoring snapshot")
	}
	fmt.Fprintf(&b, ", %s received, %.0fs", humanBytes(self.NetReceivedBytes), pr.Elapsed.Seconds())
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", b.String())
		p.lineOpen = true
		return
	}
	fmt.Fprintln(p.w, b.String())
}

// note prints a step on a line of its own.
func (p *progressLine) note(s string) {
	p.endLine()
	fmt.Fprintln(p.w, s)
}

// endLine ends an open progress line so the next message starts clean.
func (p *progressLine) endLine() {
	if p.lineOpen {
		fmt.Fprintln(p.w)
		p.lineOpen = false
	}
}

// bar draws done/total as a bar of width cells.
func bar(done, total uint64, width int) string {
	if total == 0 {
		return ""
	}
	full := int(min(done, total) * uint64(width) / total)
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]"
}

// runReplace runs one replacement with its progress on w.
func runReplace(ctx context.Context, opts replace.Options, w io.Writer) (replace.Summary, error) {
	line := newProgressLine(w, opts.New.ID)
	opts.Progress, opts.Note = line.show, line.note
	sum, err := replace.Run(ctx, opts)
	line.endLine()
	var rerr *replace.Error
	if errors.As(err, &rerr) {
		return sum, explainedError{rerr}
	}
	return sum, err
}

func printSummary(w io.Writer, s replace.Summary) {
	fmt.Fprintf(w, "replaced %s with %s in %.1fs (catch-up %.1fs)\n", s.Old, s.New,
		s.Elapsed.Seconds(), s.CatchUp.Seconds())
	fetched := fmt.Sprintf("%s received over Raft", humanBytes(s.RaftBytes))
	if s.SyncBytes > 0 {
		fetched = fmt.Sprintf("%s in %d blocks fetched by block sync, %s", humanBytes(s.SyncBytes), s.SyncBlocks, fetched)
	}
	fmt.Fprintf(w, "  %s: %s\n", s.New, fetched)
	fmt.Fprintf(w, "  voters: %s; leader: %s", strings.Join(s.Voters, ", "), s.Leader)
	if s.OldWasLeader {
		fmt.Fprintf(w, " (%s led before)", s.Old)
	}
	fmt.Fprintln(w)
	if len(s.NonVoters) > 0 {
		fmt.Fprintf(w, "  non-voters: %s\n", strings.Join(s.NonVoters, ", "))
	}
	fmt.Fprintf(w, "  %s is no longer a member: stop its process and keep or delete its data dir\n", s.Old)
}
