package tenantnet_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/testenv"
)

// BenchmarkEgressRules measures what the egress rules cost a tenant's requests:
// connections from a tenant's namespace to the internet stand-in (connect, read
// its greeting, close), through bex's chains as Install writes them ("rules":
// the reverse-path check of the raw table on every packet from a tenant, the
// non-public ranges checked on every packet forwarded), beside the same
// chains without them ("baseline": the rules before, which matched the source
// subnet only), in one run, the two taking turns so that the machine's load
// falls on both alike; and the rules without the reverse-path check
// ("ranges-only"), to tell the two costs apart. The rules are swapped between
// turns, not while one is measured.
func BenchmarkEgressRules(b *testing.B) {
	cfg := tenantnet.DefaultConfig()
	cfg.ChainPrefix, cfg.AppsSubnet, cfg.BuildsSubnet = "BEXBENCH", "10.235.0.0/16", "10.236.0.0/16"
	cfg.ResolvConf = b.TempDir() + "/resolv.conf"
	if err := os.WriteFile(cfg.ResolvConf, []byte("nameserver 10.255.255.53\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	out := testenv.StartOutside(b)
	install(b, cfg)
	ns, _ := tenant(b, cfg)
	res, err := cfg.HostResolvers()
	if err != nil {
		b.Fatal(err)
	}
	full := cfg.Rules(res)
	raw := "BEXBENCH-PREROUTING"
	baseline := slices.DeleteFunc(slices.Clone(full), func(r tenantnet.Rule) bool {
		s := r.String()
		return r.Chain == raw || strings.Contains(s, "REJECT") || r.Chain == "BEXBENCH-FORWARD" && strings.Contains(s, "--dport 53")
	})
	if len(baseline) >= len(full)-1 {
		b.Fatalf("the baseline leaves out %d rules", len(full)-len(baseline))
	}
	target := netip.AddrPortFrom(out.Addr, uint16(out.TCPPort))
	type turn struct {
		name  string
		rules []tenantnet.Rule
		n     int
		took  time.Duration
		lat   []time.Duration
	}
	// The rules without the raw table's reverse-path check: what the ranges cost
	// apart from it.
	noRPF := slices.DeleteFunc(slices.Clone(full), func(r tenantnet.Rule) bool { return r.Chain == raw })
	turns := []*turn{{name: "rules", rules: full}, {name: "baseline", rules: baseline}, {name: "ranges-only", rules: noRPF}}
	const perSlice, rounds = 200, 5
	slice := func(t *turn) {
		restoreChains(b, []string{"BEXBENCH-INPUT", "BEXBENCH-FORWARD", "BEXBENCH-POSTROUTING", raw}, t.rules)
		err := tenantnet.InNetNS(ns, func() error {
			for range perSlice {
				start := time.Now()
				if got := tcpProbe(target); got != testenv.Greeting {
					return fmt.Errorf("request: %s", got)
				}
				d := time.Since(start)
				t.n, t.took, t.lat = t.n+1, t.took+d, append(t.lat, d)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, t := range turns { // warm up: the first connections of a namespace are slower
		slice(t)
		t.n, t.took, t.lat = 0, 0, nil
	}
	for b.Loop() {
		for range rounds {
			for _, t := range turns {
				slice(t)
			}
		}
	}
	restoreChains(b, []string{"BEXBENCH-INPUT", "BEXBENCH-FORWARD", "BEXBENCH-POSTROUTING", raw}, full)
	rate := func(t *turn) float64 { return float64(t.n) / t.took.Seconds() }
	for _, t := range turns {
		slices.Sort(t.lat)
		b.ReportMetric(rate(t), t.name+"-req/s")
		b.ReportMetric(float64(t.lat[len(t.lat)/2].Microseconds()), t.name+"-p50-us")
		b.ReportMetric(float64(t.lat[len(t.lat)*99/100].Microseconds()), t.name+"-p99-us")
	}
	b.ReportMetric(rate(turns[0])/rate(turns[1]), "rules/baseline")
	b.ReportMetric(rate(turns[2])/rate(turns[1]), "ranges-only/baseline")
	b.ReportMetric(float64(len(full)-len(baseline)), "rules-added")
	b.ReportMetric(0, "ns/op")
}

// restoreChains replaces the rules of chains with rules, as Install does.
func restoreChains(b *testing.B, chains []string, rules []tenantnet.Rule) {
	b.Helper()
	var in strings.Builder
	for _, table := range []string{"raw", "filter", "nat"} {
		fmt.Fprintf(&in, "*%s\n", table)
		for _, c := range chains {
			if (table == "raw") == strings.HasSuffix(c, "-PREROUTING") && (table == "nat") == strings.HasSuffix(c, "-POSTROUTING") {
				fmt.Fprintf(&in, ":%s - [0:0]\n", c)
			}
		}
		for _, r := range rules {
			if r.Table == table {
				fmt.Fprintf(&in, "-A %s %s\n", r.Chain, strings.Join(r.Args, " "))
			}
		}
		in.WriteString("COMMIT\n")
	}
	cmd := exec.CommandContext(context.Background(), "iptables-restore", "-w", "5", "--noflush")
	cmd.Stdin = strings.NewReader(in.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("iptables-restore: %v: %s", err, out)
	}
}
