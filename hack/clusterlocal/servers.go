package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"bex.co/bex/internal/machine/baseimage"
)

// The Redis that the managed Redis databases run on this node (the deployer's
// --redis-image, through hack/install-bex.sh's REDIS_IMAGE). No image can be
// pulled here, so it is bex's redis stand-in as bex up --local-bases runs it on
// one machine (bookworm's Redis 7 with redis-cli, the official image's
// docker-entrypoint.sh contract), unchanged, pushed to bex's registry as
// redis:7: the tag is the version the deployer offers (its version is the
// image's tag).
const (
	redisRepo = "redis"
	redisTag  = "7"
)

// redisImage is the Redis image's name as the StatefulSets give it.
func redisImage() string { return registryHost + "/" + redisRepo + ":" + redisTag }

// serverImages are the images of the databases' servers that bex's registry
// holds on this node: CloudNativePG's operand (cnpg.go) and Redis.
type serverImages struct {
	operand, redis v1.Image
}

// buildServerImages makes them from the postgres and redis stand-ins (built
// by mmdebstrap, or found in the machine's cache, baseimage.DefaultCacheDir).
func buildServerImages(ctx context.Context) (serverImages, error) {
	t := time.Now()
	c := baseimage.DefaultConfig()
	c.Kinds = []string{"postgres", "redis"}
	imgs, err := baseimage.Build(ctx, c)
	if err != nil {
		return serverImages{}, err
	}
	bases := map[string]v1.Image{}
	for _, img := range imgs {
		p, err := ocilayout.FromPath(img.Layout)
		if err != nil {
			return serverImages{}, err
		}
		h, err := v1.NewHash(img.Digest)
		if err != nil {
			return serverImages{}, err
		}
		if bases[img.Kind], err = p.Image(h); err != nil {
			return serverImages{}, err
		}
	}
	if bases["postgres"] == nil || bases["redis"] == nil {
		return serverImages{}, errors.New("baseimage built no postgres or no redis stand-in")
	}
	operand, err := operandFrom(bases["postgres"])
	if err != nil {
		return serverImages{}, fmt.Errorf("the Postgres operand image: %w", err)
	}
	say("database server images (bex's postgres stand-in with postgres at uid %d, its redis stand-in) ready in %.0f s", postgresUID, time.Since(t).Seconds())
	return serverImages{operand: operand, redis: bases["redis"]}, nil
}

// push pushes both to bex's registry.
func (s serverImages) push(ctx context.Context, l *layout, k kubectl) error {
	if err := l.pushImage(ctx, k, s.operand, operandRepo, operandTag, "Postgres operand"); err != nil {
		return err
	}
	return l.pushImage(ctx, k, s.redis, redisRepo, redisTag, "Redis")
}

// pushImage pushes img to bex's registry as repo:tag (through its node port, as
// the registry's user builder, as seedRegistry pushes busybox); what names it
// in messages.
func (l *layout) pushImage(ctx context.Context, k kubectl, img v1.Image, repo, tag, what string) error {
	t := time.Now()
	auth, err := builderAuth(k)
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(fmt.Sprintf("%s:%d/%s:%s", l.nodeIP, registryNodePort, repo, tag), name.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuth(auth)); err != nil {
		return fmt.Errorf("push the %s image to the registry at %s: %w", what, ref.Context().RegistryStr(), err)
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	say("%s image pushed as %s/%s:%s (%s) in %.0f s", what, registryHost, repo, tag, d, time.Since(t).Seconds())
	return nil
}

// serverBuild runs buildServerImages in the background while the node starts.
type serverBuild struct {
	done chan struct{}
	imgs serverImages
	err  error
}

func startServerBuild(ctx context.Context) *serverBuild {
	b := &serverBuild{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		b.imgs, b.err = buildServerImages(ctx)
	}()
	return b
}

func (b *serverBuild) wait() (serverImages, error) {
	<-b.done
	if b.err != nil {
		return serverImages{}, fmt.Errorf("the database server images: %w", b.err)
	}
	return b.imgs, nil
}
