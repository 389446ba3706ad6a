package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/memoryfs/memfs/client/replace"
	"github.com/memoryfs/memfs/internal/progress"
)

// The `memfs node replace` command: client/replace does the work; this
// file draws its progress and prints its summary.

// progressLine draws the catch-up's progress on stderr, on a terminal
// only (into a file or a pipe, and with --quiet, only the steps are
// written): while the new node restores a snapshot, a bar of the bytes
// block sync fetched of those wanted; otherwise a bar of its applied
// index against the commit index. Both show their rate and the time left
// at that rate.
type progressLine struct {
	w     io.Writer
	quiet bool
	id    string
	phase string        // "sync" or "log" while a bar is drawn, else ""
	bar   *progress.Bar // nil when nothing is drawn
	// newBar makes the bars (the progress package's, which draw only on
	// a terminal; a test substitutes its own).
	newBar func(phase string, total int64) *progress.Bar
}

func newProgressLine(w io.Writer, id string) *progressLine {
	p := &progressLine{w: w, id: id, quiet: global.quiet}
	p.newBar = func(phase string, total int64) *progress.Bar {
		if phase == "sync" {
			return progress.Bytes(p.w, total, p.id+" block sync", p.quiet)
		}
		return progress.Count(p.w, total, p.id+" log", "entries", p.quiet)
	}
	return p
}

// show redraws the bar for one reading of the new node.
func (p *progressLine) show(pr replace.Progress) {
	if p.quiet {
		return
	}
	self := pr.Self
	phase := "log"
	if self.Restoring || self.SyncBytesFetched < self.SyncBytesWanted {
		phase = "sync"
	}
	// The commit index moves on while the node catches up, and the log's
	// bar stays open until the node is declared caught up: its end is
	// kept one entry past what the node applied.
	total := int64(max(pr.Commit, self.AppliedIndex+1))
	if phase == "sync" {
		total = int64(max(self.SyncBytesWanted, 1))
	}
	if phase != p.phase {
		if p.phase == "sync" {
			p.bar.Finish() // the restore is over: its bar ends complete
		}
		p.endLine()
		p.phase = phase
		p.bar = p.newBar(phase, total)
	}
	p.bar.SetTotal(total)
	if phase == "sync" {
		p.bar.Set(int64(min(self.SyncBytesFetched, self.SyncBytesWanted)))
		return
	}
	p.bar.Set(int64(self.AppliedIndex))
	p.bar.Describe(fmt.Sprintf("%s log %d/%d (lag %d)", p.id, self.AppliedIndex, pr.Commit, pr.Lag))
}

// note prints a step on a line of its own.
func (p *progressLine) note(s string) {
	p.endLine()
	p.phase = ""
	fmt.Fprintln(p.w, s)
}

// endLine ends an open bar where it is, so the next message starts on a
// line of its own.
func (p *progressLine) endLine() {
	p.bar.Stop()
	p.bar = nil
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
