package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/region"
	"github.com/memoryfs/memfs/internal/progress"
)

func newRegionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "region",
		Short: "Managed memory regions: pull a file into memory, demonstrate a live handoff",
		Long: `A region keeps a cluster file in a program's memory (package client/region,
docs/regions.md). These commands are for a look at its rates: "pull" fetches a
file into a local region, "handoff" moves a region written under load from one
session to another and checks that no write was lost or reordered.`,
	}
	cmd.AddCommand(newRegionPullCmd(), newRegionHandoffCmd())
	return cmd
}

type regionPullOptions struct {
	workers int
	out     string
	plain   bool
}

func newRegionPullCmd() *cobra.Command {
	o := &regionPullOptions{workers: 4}
	cmd := &cobra.Command{
		Use:   "pull PATH",
		Short: "Fetch a file into a local region and report first-byte latency and throughput",
		Long: `Open PATH as a read-only region (no capability: a holder is not disturbed),
read its first byte (fetched at once), then wait for the background pull of the
rest with --workers fetchers. A progress bar shows on a terminal; the rates go
to standard output at the end. --out writes the region to a local file.
--plain reads the file with plain client reads instead (a baseline).`,
		Args: cobra.ExactArgs(1),
		RunE: clientRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			return o.run(ctx, cmd, c, args)
		}),
	}
	f := cmd.Flags()
	f.IntVar(&o.workers, "workers", o.workers, "background fetchers")
	f.StringVarP(&o.out, "out", "o", "", "write what was pulled to this local file")
	f.BoolVar(&o.plain, "plain", false, "read with plain client reads instead (a baseline)")
	return cmd
}

func (o *regionPullOptions) run(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
	if o.plain {
		return o.plainPull(ctx, cmd, c, args[0])
	}
	start := time.Now()
	var bar *progress.Bar
	var mu sync.Mutex
	var shown int64
	opts := region.Options{ReadOnly: true, Workers: o.workers, ProgressInterval: 100 * time.Millisecond,
		Progress: func(p region.Progress) {
			mu.Lock()
			defer mu.Unlock()
			if bar != nil && p.Local > shown {
				bar.Add(int(p.Local - shown))
				shown = p.Local
			}
		}}
	r, err := region.Open(ctx, c, args[0], opts)
	if err != nil {
		return err
	}
	defer r.Close()
	opened := time.Since(start)
	mu.Lock()
	bar = progress.Bytes(cmd.ErrOrStderr(), r.Size(), "pull "+args[0], global.quiet)
	mu.Unlock()
	var first time.Duration
	if r.Size() > 0 {
		if _, err := r.ReadAt(make([]byte, 1), 0); err != nil {
			return err
		}
		first = time.Since(start)
	}
	if err := r.Wait(ctx); err != nil {
		bar.Stop()
		return err
	}
	all := time.Since(start)
	mu.Lock()
	bar.Add(int(r.Size() - shown))
	shown = r.Size()
	bar.Finish()
	mu.Unlock()
	p := r.Progress()
	if o.out != "" {
		if err := os.WriteFile(o.out, r.Bytes(), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "region %s: %s, chunks of %s\n", args[0], formatBytes(r.Size()), formatBytes(int64(r.ChunkSize())))
	fmt.Fprintf(cmd.OutOrStdout(), "open %v, first byte %v, all %v: %s/s\n", round(opened), round(first), round(all), rate(r.Size(), all))
	fmt.Fprintf(cmd.OutOrStdout(), "fetched %s over the network, %s from holes or local copies\n",
		formatBytes(p.Pulled), formatBytes(r.Size()-p.Pulled))
	return nil
}

// plainPull is the baseline: the same file through plain client reads.
func (o *regionPullOptions) plainPull(ctx context.Context, cmd *cobra.Command, c *client.Client, path string) error {
	start := time.Now()
	f, err := c.OpenFileContext(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	bar := progress.Bytes(cmd.ErrOrStderr(), size, "read "+path, global.quiet)
	var first time.Duration
	if size > 0 {
		if _, err := f.ReadAt(make([]byte, 1), 0); err != nil {
			return err
		}
		first = time.Since(start)
	}
	var out io.Writer = io.Discard
	if o.out != "" {
		file, err := os.Create(o.out)
		if err != nil {
			return err
		}
		defer file.Close()
		out = file
	}
	n, err := io.CopyBuffer(onlyWriter{out}, io.TeeReader(io.NewSectionReader(f, 0, size), bar), make([]byte, copyBuf))
	if err != nil {
		bar.Stop()
		return err
	}
	bar.Finish()
	all := time.Since(start)
	fmt.Fprintf(cmd.OutOrStdout(), "file %s: %s through plain reads of %s\n", path, formatBytes(n), formatBytes(copyBuf))
	fmt.Fprintf(cmd.OutOrStdout(), "first byte %v, all %v: %s/s\n", round(first), round(all), rate(n, all))
	return nil
}

func round(d time.Duration) time.Duration {
	switch {
	case d > time.Second:
		return d.Round(time.Millisecond)
	case d > time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)/d.Seconds())
}

type regionHandoffOptions struct {
	path     string
	size     byteSize
	hot      byteSize
	interval time.Duration
	rounds   int
	settle   time.Duration
	keep     bool
}

func newRegionHandoffCmd() *cobra.Command {
	o := &regionHandoffOptions{path: "/.region-handoff", size: 64 << 20, hot: 16 << 20, interval: 500 * time.Microsecond, rounds: 1,
		settle: 200 * time.Millisecond}
	cmd := &cobra.Command{
		Use:   "handoff",
		Short: "Hand a region written under load from one session to another and check every write",
		Long: `A demonstration of a live handoff between two sessions of this process (two
hosts in a real deployment). An application writes an 8-byte counter into the
chunks of the first --hot bytes of a --size region, one write every
--interval. Each round another session leeches the region while the writes go
on, the holder finalizes, and the application resumes on the new holder.

After every round the new holder reads every slot back: each must hold the
last counter the application wrote into it, whichever session wrote it (a lost
write shows as an older value, a reordered one too). At the end the committed
file is checked the same way through a read-only region of a third session.
Reported per round: the pause (the application's last accepted write on the old
holder to its first on the new one), the finalize, the bytes pushed in it (and how
many of them the handoff command itself carried), the
bytes written since the leecher registered, and the bytes the new holder
fetched again (the chunks that changed after it pulled them), with how it
learnt which: listed by the handoff, or from every chunk's hash read again. A --path the demo made is removed at the
end unless --keep; an existing file is used as it is (extended to --size) and
kept, its first chunks overwritten with counters.`,
		Args: cobra.NoArgs,
		RunE: clientRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			return o.run(ctx, cmd, c, args)
		}),
	}
	h := cmd.Flags()
	h.StringVar(&o.path, "path", o.path, "cluster file of the region (created, or extended to --size)")
	h.Var(&o.size, "size", "region size")
	h.Var(&o.hot, "hot", "bytes at the start of the region the application writes into")
	h.DurationVar(&o.interval, "interval", o.interval, "time between two writes of the application")
	h.IntVar(&o.rounds, "rounds", o.rounds, "handoffs, back and forth between the two sessions")
	h.DurationVar(&o.settle, "settle", o.settle, "writes on the new holder before the next round")
	h.BoolVar(&o.keep, "keep", false, "keep the file")
	return cmd
}

// counterSlots is how many 8-byte counters the application keeps in
// each chunk it writes.
const counterSlots = 64

// app is the application that moves between hosts: it writes a counter
// into the hot chunks of whichever region it has now, and remembers the
// last value of every chunk.
type app struct {
	cs, chunks int
	interval   time.Duration

	mu      sync.Mutex // held while writing; a check holds it to stop the app
	r       *region.Region
	v       uint64 // the last counter written
	writes  int
	last    []uint64
	lastOK  time.Time // the last accepted write
	resumed chan resumption
	next    chan *region.Region
	err     error
}

// resumption is when the application went on after a handoff.
type resumption struct {
	lastOK time.Time // its last accepted write on the old holder
	first  time.Time // when its first write on the new one was accepted
}

func (a *app) run(ctx context.Context) {
	var b [8]byte
	var waitFrom time.Time
	for ctx.Err() == nil {
		a.mu.Lock()
		r := a.r
		v := a.v + 1
		i := int(v) % len(a.last)
		for k := range 8 {
			b[k] = byte(v >> (8 * k))
		}
		_, err := r.WriteAtContext(ctx, b[:], a.offset(i))
		switch {
		case err == nil:
			a.v, a.last[i] = v, v
			a.writes++
			now := time.Now()
			if !waitFrom.IsZero() {
				a.resumed <- resumption{lastOK: waitFrom, first: now}
				waitFrom = time.Time{}
			}
			a.lastOK = now
			a.mu.Unlock()
		case errors.Is(err, region.ErrHandedOff):
			waitFrom = a.lastOK
			a.mu.Unlock()
			select {
			case nr := <-a.next:
				a.mu.Lock()
				a.r = nr
				a.mu.Unlock()
			case <-ctx.Done():
				return
			}
			continue
		default:
			a.err = err
			a.mu.Unlock()
			return
		}
		select {
		case <-time.After(a.interval):
		case <-ctx.Done():
		}
	}
}

// offset is where counter slot i lies: slots go round the chunks, so that
// consecutive writes land in different chunks and a chunk's other slots
// keep older values (a stale copy of a chunk shows in them).
func (a *app) offset(i int) int64 {
	return int64(i%a.chunks)*int64(a.cs) + int64(i/a.chunks)*8
}

// check reads every chunk of r and compares it with the last value the
// application wrote there; the application waits meanwhile.
func (a *app) check(r io.ReaderAt) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b [8]byte
	n := 0
	for i, want := range a.last {
		if want == 0 {
			continue // never written: the file's own content
		}
		n++
		if _, err := r.ReadAt(b[:], a.offset(i)); err != nil {
			return 0, err
		}
		var got uint64
		for k := range 8 {
			got |= uint64(b[k]) << (8 * k)
		}
		if got != want {
			return 0, fmt.Errorf("chunk %d slot %d holds %d, the application last wrote %d there: a write was lost or reordered",
				i%a.chunks, i/a.chunks, got, want)
		}
	}
	return n, nil
}

type handoffRound struct {
	pause, took, leech                           time.Duration
	after                                        [4]time.Duration // seen, trusted, ready, first write: after the finalize returned
	pushed, final, dirty, refetched, leechPulled int64
}

func (o *regionHandoffOptions) run(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string) error {
	out := cmd.OutOrStdout()
	path, size := o.path, int64(o.size)
	hosts := make([]*client.Client, 2)
	for k := range hosts {
		h, err := newClient(cmd, client.WithCaps())
		if err != nil {
			return err
		}
		defer h.Close()
		hosts[k] = h.WithContext(ctx)
	}
	_, statErr := c.Stat(path)
	existed := statErr == nil
	holder, err := region.Open(ctx, hosts[0], path, region.Options{Create: true, Size: size})
	if err != nil {
		return err
	}
	defer holder.Close()
	if !o.keep && !existed {
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			_ = c.WithContext(cctx).Remove(path)
		}()
	}
	cs := holder.ChunkSize()
	hot := int(min(max(int64(o.hot), int64(cs)), holder.Size()) / int64(cs))
	fmt.Fprintf(out, "region %s: %s, chunks of %s; the application writes a counter into %d slots of %d chunks (%s), every %v\n",
		path, formatBytes(holder.Size()), formatBytes(int64(cs)), hot*counterSlots, hot, formatBytes(int64(hot*cs)), o.interval)
	a := &app{cs: cs, chunks: hot, interval: o.interval, r: holder, last: make([]uint64, hot*counterSlots),
		// From the clock, not from 1: a second run on the same file
		// would write the values the first left in the same slots, and
		// an unchanged chunk travels not at all.
		v:       uint64(time.Now().UnixNano()),
		resumed: make(chan resumption, 1), next: make(chan *region.Region)}
	actx, stopApp := context.WithCancel(ctx)
	appDone := make(chan struct{})
	go func() { a.run(actx); close(appDone) }()
	defer func() { stopApp(); <-appDone }()

	var rounds []handoffRound
	for rd := range o.rounds {
		to := hosts[(rd+1)%2]
		var hr handoffRound
		lstart := time.Now()
		l, err := region.Leech(ctx, to, path, region.Options{})
		if err != nil {
			return err
		}
		for l.Progress().Local < l.Progress().Size {
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				l.Cancel()
				return ctx.Err()
			}
		}
		hr.leech, hr.leechPulled = time.Since(lstart), l.Progress().Pulled
		if err := l.Ready(ctx); err != nil {
			l.Cancel()
			return err
		}
		if _, err := holder.WaitLeecher(ctx, true); err != nil {
			l.Cancel()
			return err
		}
		type taken struct {
			r   *region.Region
			err error
		}
		// The new holder resumes the application as soon as it has the
		// region, as another host would: not after the old holder's
		// Finalize returned (which then still frees its memory).
		// Counted from here: the leecher fetches nothing more until its
		// Take drops what changed.
		pulledBefore := l.Progress().Pulled
		tc := make(chan taken, 1)
		go func() {
			r, err := l.Take(ctx)
			tk := taken{r: r, err: err}
			if err == nil {
				select {
				case a.next <- r:
				case <-appDone:
				}
			}
			tc <- tk
		}()
		hs, err := holder.Finalize(ctx)
		finalized := time.Now()
		if err != nil {
			l.Cancel()
			return fmt.Errorf("round %d: finalize: %w", rd+1, err)
		}
		tk := <-tc
		if tk.err != nil {
			return fmt.Errorf("round %d: take: %w", rd+1, tk.err)
		}
		var res resumption
		select {
		case res = <-a.resumed:
			hr.pause = res.first.Sub(res.lastOK)
		case <-appDone:
			return fmt.Errorf("round %d: the application stopped: %w", rd+1, a.err)
		}
		holder = tk.r
		defer holder.Close()
		select {
		case <-time.After(o.settle):
		case <-ctx.Done():
			return ctx.Err()
		}
		n, err := a.check(holder)
		if err != nil {
			return fmt.Errorf("round %d: %w", rd+1, err)
		}
		hr.took, hr.pushed, hr.final, hr.dirty = hs.Took, hs.Pushed, hs.Final, hs.DirtySinceLeech
		hr.refetched = holder.Progress().Pulled - pulledBefore
		ts := l.Taken()
		for k, at := range []time.Time{ts.Seen, ts.Trusted, ts.Ready, res.first} {
			hr.after[k] = at.Sub(finalized)
		}
		how := "listed by the handoff"
		if !ts.Reported {
			how = "found by reading every hash"
		}
		rounds = append(rounds, hr)
		fmt.Fprintf(out, "round %d: pause %v (finalize %v; after it returned: handoff seen %v, trusted %v, region ready %v, first write %v), pushed %s in the finalize (%s of it in the handoff command), %s written since the leecher came, "+
			"%s fetched again by the new holder (%d chunks changed, %s); leech pulled %s in %v; %d counters checked\n",
			rd+1, round3(hr.pause), round3(hr.took), round3(hr.after[0]), round3(hr.after[1]), round3(hr.after[2]), round3(hr.after[3]), formatBytes(hr.pushed), formatBytes(hr.final), formatBytes(hr.dirty),
			formatBytes(hr.refetched), ts.Changed, how, formatBytes(hr.leechPulled), round(hr.leech), n)
	}
	stopApp()
	<-appDone
	if a.err != nil {
		return fmt.Errorf("the application's writes failed: %w", a.err)
	}
	if err := holder.Sync(ctx); err != nil {
		return err
	}
	// The committed file, through a third session.
	ro, err := region.Open(ctx, c, path, region.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	defer ro.Close()
	if err := ro.Wait(ctx); err != nil {
		return err
	}
	if _, err := a.check(ro); err != nil {
		return fmt.Errorf("committed file: %w", err)
	}
	pauses := make([]time.Duration, len(rounds))
	for k, hr := range rounds {
		pauses[k] = hr.pause
	}
	slices.Sort(pauses)
	fmt.Fprintf(out, "%d writes, %d handoffs: no write lost or reordered (every counter checked after every handoff and in the committed file)\n",
		a.writes, len(rounds))
	if len(pauses) > 0 {
		fmt.Fprintf(out, "pause p50 %v, p99 %v, max %v\n", round3(quantile(pauses, 0.5)), round3(quantile(pauses, 0.99)), round3(pauses[len(pauses)-1]))
	}
	return nil
}

func round3(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }

// quantile of sorted durations, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	k := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}
