package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bounds of etcd's space quota (QuotaFor).
const (
	MaxQuotaBytes = 2 << 30  // etcd's own default
	MinQuotaBytes = 64 << 20 // bex's objects on a fresh machine take a few MiB
)

// QuotaFor is etcd's space quota (--quota-backend-bytes) for a data dir on the file
// system holding dir: 5% of the file system, between MinQuotaBytes and
// MaxQuotaBytes. etcd's database reaching its quota is an alarm (NOSPACE) that
// makes the API read-only and that bex recovers from (compaction, defragmentation,
// disarm: recoverSpace); the disk filling under etcd is a fatal error in etcd
// (a commit that fails on ENOSPC ends the process). A quota of the same order as
// the margin the gitserver keeps free (the smaller of 1 GiB and 5%) makes the first
// come long before the second: bex's objects take kilobytes each, and the API
// server compacts etcd's history every 5 minutes.
func QuotaFor(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return MaxQuotaBytes
	}
	q := int64(st.Blocks) * int64(st.Bsize) / 20
	return min(max(q, MinQuotaBytes), MaxQuotaBytes)
}

// The etcd JSON gateway's messages used here (uint64s are strings in its JSON).
type (
	etcdHeader struct {
		MemberID string `json:"member_id"`
		Revision string `json:"revision"`
	}
	etcdAlarm struct {
		MemberID string `json:"memberID"`
		Alarm    string `json:"alarm"`
	}
	etcdStatus struct {
		Header etcdHeader `json:"header"`
		DBSize string     `json:"dbSize"`
	}
)

// alarms lists etcd's alarms.
func (cp *ControlPlane) alarms(ctx context.Context, hc *http.Client) ([]etcdAlarm, error) {
	var resp struct {
		Alarms []etcdAlarm `json:"alarms"`
	}
	err := postJSON(ctx, hc, cp.EtcdURL()+"/v3/maintenance/alarm", map[string]any{"action": "GET"}, &resp)
	return resp.Alarms, err
}

func (cp *ControlPlane) status(ctx context.Context, hc *http.Client) (rev, size int64, err error) {
	var st etcdStatus
	if err := postJSON(ctx, hc, cp.EtcdURL()+"/v3/maintenance/status", struct{}{}, &st); err != nil {
		return 0, 0, err
	}
	rev, _ = strconv.ParseInt(st.Header.Revision, 10, 64)
	size, _ = strconv.ParseInt(st.DBSize, 10, 64)
	return rev, size, nil
}

// recoverSpace handles a NOSPACE alarm: etcd's database reached its quota, and
// etcd refuses every write (reads and deletes still work) until the alarm is
// disarmed. It compacts the history up to the current revision, defragments (the
// database file gives back the pages compaction freed; defragmentation needs free
// disk for a copy of the live data) and disarms the alarm once the database is
// under 90% of the quota (disarmed any closer, the next writes would raise it again
// at once). It says what it did in one line; with the database still too large
// (live data, not history) the alarm stays and the line says so. Without an alarm
// it does nothing.
func (cp *ControlPlane) recoverSpace(ctx context.Context, hc *http.Client) error {
	alarms, err := cp.alarms(ctx, hc)
	if err != nil {
		return fmt.Errorf("etcd alarms: %w", err)
	}
	var nospace []etcdAlarm
	for _, a := range alarms {
		if a.Alarm == "NOSPACE" {
			nospace = append(nospace, a)
		}
	}
	if len(nospace) == 0 {
		return nil
	}
	log := cp.log()
	rev, before, err := cp.status(ctx, hc)
	if err != nil {
		return fmt.Errorf("etcd status: %w", err)
	}
	err = postJSON(ctx, hc, cp.EtcdURL()+"/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil)
	if err != nil && !strings.Contains(err.Error(), "required revision has been compacted") {
		return fmt.Errorf("etcd compaction to revision %d: %w", rev, err)
	}
	if err := postJSON(ctx, hc, cp.EtcdURL()+"/v3/maintenance/defragment", struct{}{}, nil); err != nil {
		log.Warn("etcd's database is at its space quota (NOSPACE alarm) and cannot be defragmented: the API is read-only until there is room",
			"db", before, "quota", cp.quota, "err", err)
		return nil
	}
	_, after, err := cp.status(ctx, hc)
	if err != nil {
		return fmt.Errorf("etcd status: %w", err)
	}
	if after >= cp.quota/4*3 {
		log.Warn("etcd's database is at its space quota (NOSPACE alarm) even after compaction and defragmentation: the API is read-only until apps or releases are deleted",
			"db", after, "quota", cp.quota)
		return nil
	}
	for _, a := range nospace {
		if err := postJSON(ctx, hc, cp.EtcdURL()+"/v3/maintenance/alarm",
			map[string]any{"action": "DEACTIVATE", "memberID": a.MemberID, "alarm": "NOSPACE"}, nil); err != nil {
			return fmt.Errorf("etcd disarm NOSPACE: %w", err)
		}
	}
	log.Warn("etcd's database had reached its space quota (NOSPACE alarm, the API read-only): compacted and defragmented, writes allowed again",
		"before", before, "after", after, "quota", cp.quota)
	return nil
}

// WatchSpace recovers etcd from a NOSPACE alarm raised while bex runs (see
// recoverSpace; the etcd process's readiness check does the same at each start),
// asking every Config.AlarmInterval until ctx ends. An etcd that does not answer (being
// restarted) is asked again next time.
func (cp *ControlPlane) WatchSpace(ctx context.Context) {
	hc, err := cp.EtcdClient()
	if err != nil {
		cp.log().Error("etcd client", "err", err)
		return
	}
	every := cp.cfg.AlarmInterval
	if every <= 0 {
		every = DefaultConfig().AlarmInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := cp.recoverSpace(rctx, hc); err != nil && !errors.Is(err, context.Canceled) {
			cp.log().Warn("cannot check etcd for a NOSPACE alarm", "err", err)
		}
		cancel()
	}
}
