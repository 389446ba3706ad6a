// Package progress draws a progress bar for a long command (bytes or
// items done, rate, time left) on a terminal, with
// github.com/schollz/progressbar.
//
// It draws only on a terminal: into a pipe or a file, or when asked to be
// quiet, a Bar does nothing, so scripts read the same output they always
// did. It must never write to standard output, which carries data.
package progress

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Bar is a progress bar, or nothing (nil is a valid Bar that draws nothing).
type Bar struct {
	b *progressbar.ProgressBar
	w io.Writer
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Bytes returns a bar on w counting bytes up to total (negative when
// unknown: then it shows what is done and the rate), described by desc;
// a Bar that draws nothing when quiet or when w is not a terminal.
func Bytes(w io.Writer, total int64, desc string, quiet bool) *Bar {
	if quiet || !IsTerminal(w) {
		return nil
	}
	return &Bar{w: w, b: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionSetWidth(30),
		// Redrawn at most this often: a fast copy is not slowed by its bar.
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(w, "\n") }),
	)}
}

// Items returns a bar on w counting items (unknown total: the count and
// the rate), described by desc; nothing when quiet or w is no terminal.
func Items(w io.Writer, desc, unit string, quiet bool) *Bar {
	if quiet || !IsTerminal(w) {
		return nil
	}
	return &Bar{w: w, b: progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(unit),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(w, "\n") }),
	)}
}

// ItemsOf returns a bar on w counting items (named unit) up to total:
// the count, the rate and the time left; nothing when quiet or w is no
// terminal.
func ItemsOf(w io.Writer, total int64, desc, unit string, quiet bool) *Bar {
	if quiet || !IsTerminal(w) {
		return nil
	}
	return &Bar{w: w, b: progressbar.NewOptions64(max(total, 1),
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(unit),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(w, "\n") }),
	)}
}

// Count returns a bar on w counting items (named unit) up to total, with
// the rate and the time left at that rate; total may move (SetTotal), as
// a log's end does while a node catches up with it. Nothing when quiet
// or w is no terminal.
func Count(w io.Writer, total int64, desc, unit string, quiet bool) *Bar {
	if quiet || !IsTerminal(w) {
		return nil
	}
	return &Bar{w: w, b: progressbar.NewOptions64(max(total, 1),
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(unit),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetWidth(20),
		// No throttle: a caller sets the end, the count and the text
		// together, a few times a second, and the last of the three
		// must be drawn.
		progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(w, "\n") }),
	)}
}

// Waiting shows a spinner and the elapsed time on w for one long operation
// whose progress cannot be known, until the returned stop is called, which
// erases it; nothing when quiet or w is no terminal.
func Waiting(w io.Writer, desc string, quiet bool) (stop func()) {
	if quiet || !IsTerminal(w) {
		return func() {}
	}
	b := progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSpinnerType(14),
	)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			_ = b.Add(0) // redraws the spinner and the time
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		close(done)
		<-exited
		_ = b.Clear()
	}
}

// Add counts n items done.
func (b *Bar) Add(n int) {
	if b != nil {
		_ = b.b.Add(n)
	}
}

// Write counts len(p) bytes done, so a Bar can sit in an io.TeeReader.
func (b *Bar) Write(p []byte) (int, error) {
	if b != nil {
		_ = b.b.Add(len(p))
	}
	return len(p), nil
}

// Set sets what is done to n (of a Bytes or Count bar).
func (b *Bar) Set(n int64) {
	if b != nil {
		_ = b.b.Set64(n)
	}
}

// SetTotal moves the bar's end to n (at least 1).
func (b *Bar) SetTotal(n int64) {
	if n = max(n, 1); b != nil && b.b.GetMax64() != n {
		b.b.ChangeMax64(n) // which redraws: only when it changed
	}
}

// Describe changes the text before the bar.
func (b *Bar) Describe(desc string) {
	if b != nil {
		b.b.Describe(desc)
	}
}

// Finish draws the bar complete and ends its line.
func (b *Bar) Finish() {
	if b != nil {
		_ = b.b.Finish()
	}
}

// Stop ends the bar's line where it is (a failed or interrupted copy), so
// that an error message starts on a line of its own.
func (b *Bar) Stop() {
	if b != nil && !b.b.IsFinished() {
		_ = b.b.Exit() // which ends the line (OptionOnCompletion)
	}
}
