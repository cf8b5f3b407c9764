package main

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The apps' volumes: on the one-node cluster local volumes of its node; on the
// cluster of containers local volumes of every node (each machine mounts
// DIR/volumes), never hostPath, which the kubelet gives to no fsGroup.
func TestStorageManifests(t *testing.T) {
	l, err := newLayout("/tmp/bex-storage-test")
	if err != nil {
		t.Fatal(err)
	}
	for _, shared := range []bool{false, true} {
		docs := strings.Split(l.storageManifests(shared), "---\n")
		if len(docs) != appVolumes+1 {
			t.Fatalf("shared=%v: %d objects, want the StorageClass and %d volumes", shared, len(docs), appVolumes)
		}
		for i, d := range docs[1:] {
			var pv struct {
				Spec struct {
					Local        *struct{ Path string } `json:"local"`
					HostPath     any                    `json:"hostPath"`
					NodeAffinity struct {
						Required struct {
							NodeSelectorTerms []struct {
								MatchExpressions []struct {
									Key    string   `json:"key"`
									Values []string `json:"values"`
								} `json:"matchExpressions"`
							} `json:"nodeSelectorTerms"`
						} `json:"required"`
					} `json:"nodeAffinity"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(d), &pv); err != nil {
				t.Fatalf("shared=%v volume %d: %v\n%s", shared, i, err, d)
			}
			if pv.Spec.Local == nil || pv.Spec.Local.Path != l.appVolumeDir(i) || pv.Spec.HostPath != nil {
				t.Fatalf("shared=%v volume %d is not the local volume at %s:\n%s", shared, i, l.appVolumeDir(i), d)
			}
			terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
			if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
				t.Fatalf("shared=%v volume %d: node affinity %+v", shared, i, terms)
			}
			e := terms[0].MatchExpressions[0]
			want := "kubernetes.io/hostname"
			if shared {
				want = "kubernetes.io/os"
			}
			if e.Key != want {
				t.Errorf("shared=%v volume %d: node affinity on %s %v, want %s", shared, i, e.Key, e.Values, want)
			}
		}
	}
}
