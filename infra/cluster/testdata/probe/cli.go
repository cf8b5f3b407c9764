package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
)

// The probe also runs as a command, for a build step's RUN line
// (infra/cluster/buildsteps_test.go): what a step can reach, printed one
// "PROBE {json}" line per attempt into the build's output, which the pusher sees.
//
//	probe tcp HOST:PORT...   a TCP connection to each, at once
//	probe dns NAME...        a lookup of each through the step's resolv.conf
func init() {
	if len(os.Args) < 2 {
		return // the app: main serves HTTP
	}
	var out []result
	switch os.Args[1] {
	case "tcp":
		out = dialAll(os.Args[2:])
	case "dns":
		for _, name := range os.Args[2:] {
			res := result{Target: "dns " + name}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			addrs, err := net.DefaultResolver.LookupHost(ctx, name)
			cancel()
			if err != nil {
				res.Err = err.Error()
			} else {
				res.Connected, res.Body = true, strings.Join(addrs, ",")
			}
			out = append(out, res)
		}
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown command %q: want tcp or dns\n", os.Args[1])
		os.Exit(2)
	}
	for _, r := range out {
		b, _ := json.Marshal(r)
		fmt.Printf("PROBE %s\n", b)
	}
	os.Exit(0)
}

// dialAll makes a TCP connection to each of addrs, at once.
func dialAll(addrs []string) []result {
	out := make([]result, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			out[i] = result{Target: a}
			c, err := net.DialTimeout("tcp", a, timeout)
			if err != nil {
				out[i].Err = err.Error()
				return
			}
			out[i].Connected = true
			c.Close()
		})
	}
	wg.Wait()
	return out
}
