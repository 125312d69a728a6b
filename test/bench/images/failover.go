package main

import (
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentboot/agentboot/test/bench/internal/proc"
)

// failover downloads the customised ISO at u with n clients through a load
// balancer in front of two image-service replicas, twice: once as is (the
// baseline), once killing replica victim (SIGKILL) when 40% of all the
// bytes have arrived. A client whose download breaks resumes it as a BMC or
// curl -C does: the rest by Range, with If-Range naming the ETag it
// started with. Every client's bytes are checked against one whole
// download. It prints the two times and what resuming cost.
func failover(tlsCfg *tls.Config, u string, n int, victim *proc.Proc) error {
	sum, size, etag, err := whole(tlsCfg, u)
	if err != nil {
		return err
	}
	fmt.Printf("image service failover: %d clients each download the %d MiB customised ISO over HTTPS through a load balancer in front of two replicas\n", n, size>>20)
	base, err := downloadAll(tlsCfg, u, n, sum, size, etag, nil)
	if err != nil {
		return fmt.Errorf("without a failure: %w", err)
	}
	var once sync.Once
	var killedAt time.Time
	kill := func(received int64) {
		if received*10 >= int64(n)*size*4 {
			once.Do(func() {
				killedAt = time.Now()
				_ = victim.Cmd.Process.Kill()
			})
		}
	}
	killed, err := downloadAll(tlsCfg, u, n, sum, size, etag, kill)
	if err != nil {
		return fmt.Errorf("with a replica killed: %w", err)
	}
	if killedAt.IsZero() {
		return fmt.Errorf("the replica was never killed")
	}
	fmt.Printf("  no failure: all done in %s\n", base.took.Round(time.Millisecond))
	fmt.Printf("  a replica killed at 40%%: all done in %s (%.2fx); %d of %d downloads broke and resumed by Range (%d attempts), %d started over (the ETag changed), %d MiB sent twice; every client's bytes match the whole ISO's SHA-256\n",
		killed.took.Round(time.Millisecond), killed.took.Seconds()/base.took.Seconds(), killed.broken, n, killed.resumes, killed.restarts, killed.resent>>20)
	return nil
}

// whole downloads u once and returns its SHA-256, size and ETag.
func whole(tlsCfg *tls.Config, u string) ([32]byte, int64, string, error) {
	resp, err := newClient(tlsCfg).Get(u)
	if err != nil {
		return [32]byte{}, 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return [32]byte{}, 0, "", fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	h := sha256.New()
	size, err := io.Copy(h, resp.Body)
	if err != nil {
		return [32]byte{}, 0, "", err
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	etag := resp.Header.Get("ETag")
	if etag == "" {
		return sum, size, "", fmt.Errorf("GET %s: no ETag, nothing to resume against", u)
	}
	return sum, size, etag, nil
}

type round struct {
	took                      time.Duration
	broken, resumes, restarts int64
	resent                    int64
}

// downloadAll has n clients download u whole, resuming what breaks; each
// client's bytes must hash to sum. progress, when set, is told the bytes
// received so far by all.
func downloadAll(tlsCfg *tls.Config, u string, n int, sum [32]byte, size int64, etag string, progress func(int64)) (round, error) {
	var (
		received                 atomic.Int64
		broken, resumes, restart atomic.Int64
		resent                   atomic.Int64
		wg                       sync.WaitGroup
		errs                     = make(chan error, n)
	)
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient(tlsCfg)
			h := sha256.New()
			var off int64
			tries := 0
			for off < size {
				if tries > 0 {
					resumes.Add(1)
				}
				if tries++; tries > 20 {
					errs <- fmt.Errorf("gave up after 20 attempts at byte %d", off)
					return
				}
				got, startedOver, err := part(c, u, h, off, etag, &received, progress)
				if startedOver {
					restart.Add(1)
					resent.Add(off)
					off = 0
				}
				off += got
				if err != nil {
					if tries == 1 {
						broken.Add(1)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			if off != size || [32]byte(h.Sum(nil)) != sum {
				errs <- fmt.Errorf("a client's %d bytes do not match the whole ISO", off)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return round{}, err
	}
	return round{took: time.Since(start), broken: broken.Load(), resumes: resumes.Load(), restarts: restart.Load(), resent: resent.Load()}, nil
}

// part requests u from off on (If-Range: etag) and hashes what arrives. It
// returns the bytes taken, and whether the server sent the whole file
// instead (its ETag changed: the bytes so far are not of it).
func part(c *http.Client, u string, h hash.Hash, off int64, etag string, received *atomic.Int64, progress func(int64)) (int64, bool, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return 0, false, err
	}
	if off > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(off, 10)+"-")
		req.Header.Set("If-Range", etag)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	startedOver := false
	switch {
	case off > 0 && resp.StatusCode == http.StatusOK:
		startedOver = true
		h.Reset()
	case off > 0 && resp.StatusCode != http.StatusPartialContent, off == 0 && resp.StatusCode != http.StatusOK:
		return 0, false, fmt.Errorf("GET %s from %d: %s", u, off, resp.Status)
	}
	buf := make([]byte, 256<<10)
	var got int64
	for {
		k, err := resp.Body.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			got += int64(k)
			if total := received.Add(int64(k)); progress != nil {
				progress(total)
			}
		}
		if err == io.EOF {
			return got, startedOver, nil
		}
		if err != nil {
			return got, startedOver, err
		}
	}
}
