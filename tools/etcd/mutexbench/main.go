// Command mutexbench measures etcd's own lock recipe, go.etcd.io/etcd/client/v3/concurrency's
// Mutex (a session lease, revision-ordered keys, a watch on the key before yours), on one
// etcd, the way the Turnstile lock benchmark measures its etcd backend on the same server in
// the same run (crates/turnstile-lock/benches/lock.rs starts it and prints its rows):
//
//	-mode floor        sequential Get of one key: the etcd round trip
//	-mode uncontended  Lock+Unlock pairs per second, one session
//	-mode handoff      -tasks goroutines (a session each) loop Lock -> yield -> Unlock on one
//	                   key: hand-off latency (Unlock called -> next holder's Lock returns)
//	                   p50/p99, acquisitions per second, the share of hand-offs to another
//	                   goroutine and to the goroutine that had waited longest
//
// It prints one line of key=value pairs. Bounded by -seconds; loopback endpoints only.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "etcd client endpoint")
	mode := flag.String("mode", "handoff", "floor | uncontended | handoff")
	seconds := flag.Float64("seconds", 3, "measuring time")
	tasks := flag.Int("tasks", 32, "goroutines contending (handoff)")
	key := flag.String("key", "/go-mutex-bench", "lock prefix")
	flag.Parse()

	client, err := clientv3.New(clientv3.Config{Endpoints: []string{*endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		fail(err)
	}
	defer client.Close()
	duration := time.Duration(*seconds * float64(time.Second))
	switch *mode {
	case "floor":
		floor(client, duration)
	case "uncontended":
		uncontended(client, *key, duration)
	case "handoff":
		handoff(client, *key, *tasks, duration)
	default:
		fail(fmt.Errorf("unknown mode %q", *mode))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mutexbench:", err)
	os.Exit(1)
}

func floor(client *clientv3.Client, duration time.Duration) {
	ctx := context.Background()
	count := 0
	started := time.Now()
	for time.Since(started) < duration {
		if _, err := client.Get(ctx, "/go-mutex-bench-floor"); err != nil {
			fail(err)
		}
		count++
	}
	elapsed := time.Since(started)
	fmt.Printf("ops_per_sec=%.1f rtt_us=%.1f\n", float64(count)/elapsed.Seconds(), micros(elapsed)/float64(count))
}

func uncontended(client *clientv3.Client, key string, duration time.Duration) {
	session, err := concurrency.NewSession(client)
	if err != nil {
		fail(err)
	}
	defer session.Close()
	mutex := concurrency.NewMutex(session, key+"-uncontended")
	ctx := context.Background()
	pair := func() {
		if err := mutex.Lock(ctx); err != nil {
			fail(err)
		}
		if err := mutex.Unlock(ctx); err != nil {
			fail(err)
		}
	}
	for i := 0; i < 200; i++ {
		pair()
	}
	count := 0
	started := time.Now()
	for time.Since(started) < duration {
		pair()
		count++
	}
	fmt.Printf("pairs_per_sec=%.1f\n", float64(count)/time.Since(started).Seconds())
}

type handoffLog struct {
	sync.Mutex
	measuring   bool
	lastRelease time.Time
	lastHolder  int
	waitingFrom map[int]time.Time
	handoffs    []time.Duration
	toOther     int
	toLongest   int
	acquired    int
}

func handoff(client *clientv3.Client, key string, tasks int, duration time.Duration) {
	log := &handoffLog{lastHolder: -1, waitingFrom: map[int]time.Time{}}
	stop := make(chan struct{})
	var done sync.WaitGroup
	ctx := context.Background()
	for task := 0; task < tasks; task++ {
		session, err := concurrency.NewSession(client)
		if err != nil {
			fail(err)
		}
		defer session.Close()
		mutex := concurrency.NewMutex(session, fmt.Sprintf("%s-%d", key, tasks))
		done.Add(1)
		go func(task int) {
			defer done.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				log.Lock()
				log.waitingFrom[task] = time.Now()
				log.Unlock()
				if err := mutex.Lock(ctx); err != nil {
					fail(err)
				}
				acquired := time.Now()
				log.Lock()
				asked := log.waitingFrom[task]
				delete(log.waitingFrom, task)
				longest := true
				for _, other := range log.waitingFrom {
					if other.Before(asked) {
						longest = false
					}
				}
				if log.measuring && log.lastHolder >= 0 {
					log.acquired++
					log.handoffs = append(log.handoffs, acquired.Sub(log.lastRelease))
					if log.lastHolder != task {
						log.toOther++
					}
					if longest {
						log.toLongest++
					}
				}
				log.Unlock()
				runtime.Gosched() // the critical section, as the Rust rows' one yield
				log.Lock()
				log.lastRelease, log.lastHolder = time.Now(), task
				log.Unlock()
				if err := mutex.Unlock(ctx); err != nil {
					fail(err)
				}
			}
		}(task)
	}
	time.Sleep(300 * time.Millisecond) // every goroutine queued once
	log.Lock()
	log.measuring = true
	log.Unlock()
	started := time.Now()
	time.Sleep(duration)
	log.Lock()
	log.measuring = false
	elapsed := time.Since(started)
	log.Unlock()
	close(stop)
	done.Wait()
	sort.Slice(log.handoffs, func(i, j int) bool { return log.handoffs[i] < log.handoffs[j] })
	count := len(log.handoffs)
	if count == 0 {
		fail(fmt.Errorf("no hand-off measured"))
	}
	fmt.Printf("acquisitions_per_sec=%.1f p50_us=%.1f p99_us=%.1f to_other=%.4f to_longest=%.4f\n",
		float64(log.acquired)/elapsed.Seconds(),
		micros(percentile(log.handoffs, 0.50)), micros(percentile(log.handoffs, 0.99)),
		float64(log.toOther)/float64(count), float64(log.toLongest)/float64(count))
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	index := int(float64(len(sorted)-1) * p)
	return sorted[index]
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
