package client_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// These examples need a running cluster (memfs up), so they are compiled
// but not run by go test.

func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Any subset of the nodes will do; the client finds the others.
	c, err := client.New(ctx, []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", st.Leader)
}

func Example_files() {
	c, err := client.New(context.Background(), []string{"127.0.0.1:7001"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.MkdirAll("/projects/demo", 0o755); err != nil {
		log.Fatal(err)
	}
	f, err := c.Create("/projects/demo/notes.txt")
	if err != nil {
		log.Fatal(err)
	}
	// Write returns once the data is committed on a majority of nodes.
	if _, err := f.WriteString("replicated in memory\n"); err != nil {
		log.Fatal(err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
	data, err := c.ReadFile("/projects/demo/notes.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(data))

	// Errors are *fs.PathError values wrapping the errno.
	if _, err := c.Stat("/projects/missing"); errors.Is(err, fs.ErrNotExist) {
		fmt.Println(err) // stat /projects/missing: no such file or directory
	}
}

func ExampleClient_OpenFile_exclusive() {
	c, err := client.New(context.Background(), []string{"127.0.0.1:7001"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Fail at once if another client holds the file exclusively...
	f, err := c.OpenFile("/counter", os.O_RDWR|os.O_CREATE|client.Exclusive, 0o644)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		// ...or wait in line, for at most a minute.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		f, err = c.OpenFileContext(ctx, "/counter", os.O_RDWR|os.O_CREATE|client.ExclusiveWait, 0o644)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close() // hands the file to the next in line
	fmt.Fprintln(f, "only one writer at a time")
}

func ExampleClient_FS() {
	c, err := client.New(context.Background(), []string{"127.0.0.1:7001"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// Any io/fs code works on the cluster's tree.
	err = fs.WalkDir(c.FS(context.Background()), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fmt.Println(p)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleClient_Watch() {
	c, err := client.New(context.Background(), []string{"127.0.0.1:7001"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events, err := c.Watch(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for ev := range events {
		if ev.Index == 0 {
			fmt.Println("reconnected: events may have been missed")
			continue
		}
		fmt.Println("index", ev.Index, "changed inodes", ev.Inodes)
	}
}

// A program that reads one file often caches it under a capability: until
// another client changes the file (which first recalls the capability and
// runs OnRecall), the cached copy is the file's current content.
func ExampleCaps() {
	ctx := context.Background()
	c, err := client.New(ctx, []string{"127.0.0.1:7001"}, client.WithCaps())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stat("/etc/config.json")
	if err != nil {
		log.Fatal(err)
	}
	ino := st.Sys().(*pb.Attr).Ino

	var mu sync.Mutex
	var cached []byte
	c.Caps().OnRecall(func(inos []uint64) {
		mu.Lock()
		defer mu.Unlock()
		cached = nil // the file is about to change: drop the copy
	})
	read := func() ([]byte, error) {
		mu.Lock()
		if cached != nil && c.Caps().Held(ino) {
			defer mu.Unlock()
			return cached, nil
		}
		mu.Unlock()
		// The grant comes first, so the read below is covered by it.
		if _, err := c.Caps().Grant(ctx, []uint64{ino}, false); err != nil {
			return nil, err
		}
		data, err := c.ReadFile("/etc/config.json")
		if err != nil {
			return nil, err
		}
		mu.Lock()
		// A recall between the grant and here dropped nothing yet: keep
		// the copy only if the capability is still held. (A program with
		// several readers would also note a drop counter, as the FUSE
		// mount's metadata cache does.)
		if c.Caps().Held(ino) {
			cached = data
		}
		mu.Unlock()
		return data, nil
	}
	for range 3 {
		data, err := read() // the cluster is asked once
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(len(data))
	}
}
