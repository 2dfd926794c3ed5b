package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
)

// probeMaxAge is how long a cached probe stands for this machine: a day, so
// that a probe taken while other work ran does not stand for good.
const probeMaxAge = 24 * time.Hour

// cpuTable says how this command's plans time the CPU, once probeCPU ran.
type cpuTable struct {
	// how is one of "own" (the table was measured on this machine), "probed"
	// (the table scaled by a probe of this machine), "cached" (scaled by a
	// probe of this machine read from the cache), "run" (scaled by the probe
	// a run recorded: plan --against), "unprobed" (the probe failed: err says
	// why) or "" (no CPU table, or not probed).
	how   string
	table *parallel.Calibration // the table before scaling
	err   error
}

// probeCPU makes the "cpu" table of a.cals describe this machine: a table
// measured here (its Machine key is this machine's) is kept; any other (the
// tables shardline ships, a user's from another machine) is scaled by a
// probe of this machine (trainer.ProbeSpeed, about a quarter of a second),
// cached under the cache directory by this machine, shardline's build and the
// table, for a day. It runs once a command; a probe that fails leaves the
// table as it was, and says why on stderr (noteCalibration). With fresh (a
// run, whose step time the probe is to predict), the probe is measured now
// whatever the cache holds, and cached for the plans after it.
func (a *app) probeCPU(fresh bool) {
	if a.cpu.how != "" || a.cpu.err != nil {
		return
	}
	c := a.cals.For("cpu")
	if c == nil {
		return
	}
	a.cpu.table = c
	if c.Machine != "" && c.Machine == trainer.MachineKey(cpu.Backend{}) {
		a.cpu.how = "own"
		return
	}
	p, cached, err := a.probe(c, fresh)
	if err == nil {
		var scaled *parallel.Calibration
		if scaled, err = c.Scaled(p); err == nil {
			a.cals = a.cals.With(scaled)
			a.cpu.how = "probed"
			if cached {
				a.cpu.how = "cached"
			}
			return
		}
	}
	a.cpu.how, a.cpu.err = "unprobed", err
}

// probe is this machine's probe of c: from the cache when a probe of this
// machine, build and table younger than probeMaxAge is there and fresh is
// false (cached true), else measured now and cached.
func (a *app) probe(c *parallel.Calibration, fresh bool) (parallel.Probe, bool, error) {
	path := a.probePath(c)
	if path != "" && !fresh {
		if b, err := fileio.ReadRegular(path, 1<<16); err == nil {
			var p parallel.Probe
			if json.Unmarshal(b, &p) == nil && p.Check(c) == nil {
				if at, err := time.Parse(time.RFC3339, p.Date); err == nil && time.Since(at) < probeMaxAge && time.Since(at) > -time.Minute {
					return p, true, nil
				}
			}
		}
	}
	p, err := trainer.ProbeSpeed(cpu.Backend{}, c, version)
	if err != nil {
		return p, false, err
	}
	if path != "" {
		b, _ := json.MarshalIndent(p, "", "  ")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			err = fileio.WriteAtomic(path, append(b, '\n'))
		}
		// A cache that cannot be written costs a probe a plan: nothing else.
	}
	return p, false, nil
}

// probePath is the cache file of this machine's probe of c: under the cache
// directory (cache_dir, or the user cache directory), named by this
// machine's key, shardline's version and build (its revision, and the
// executable's size and modification time), and c's digest; "" without a
// cache directory.
func (a *app) probePath(c *parallel.Calibration) string {
	dir := a.cacheRoot()
	if dir == "" {
		return ""
	}
	build := version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" || s.Key == "vcs.modified" {
				build += " " + s.Value
			}
		}
	}
	// A build from a modified tree keeps its version and revision: the
	// executable's size and time tell one build from the next.
	if exe, err := os.Executable(); err == nil {
		if st, err := os.Stat(exe); err == nil {
			build += fmt.Sprintf(" %d %d", st.Size(), st.ModTime().UnixNano())
		}
	}
	sum := sha256.Sum256([]byte(trainer.MachineKey(cpu.Backend{}) + "\x00" + build + "\x00" + c.Digest()))
	return filepath.Join(dir, "probe", hex.EncodeToString(sum[:12])+".json")
}

// noteCalibration tells, on stderr, how the plan timed a CPU step when its
// table was not measured on host (what names it): scaled by a probe of this
// machine, with what shardline calibrate would add, or (the probe failed,
// or the plan is of another machine's run) timed by another machine's
// table, which kernel speeds between CPUs, and between machines whose CPUs
// name themselves alike, make wrong by 2× and more.
func (a *app) noteCalibration(p *parallel.Plan, host, what string) {
	c := p.Topology.Calibration
	if c == nil {
		return
	}
	calibrate := "shardline calibrate -o FILE (about four minutes) measures every kernel on %s, and the in-step and rank-sharing factors the probe carries over from that machine; " +
		"set SHARDLINE_CALIBRATION=FILE (or calibration = \"FILE\" in shardline.toml) to time plans from it"
	if pr := c.Probe; pr != nil {
		from := "measured now"
		switch a.cpu.how {
		case "cached":
			from = "cached from " + pr.Date
		case "run":
			from = "the run's, from " + pr.Date
		}
		fmt.Fprintf(a.stderr, "note: the step time is timed from a calibration measured on %s (%s), scaled to %s by a probe (%s: matmuls %.2f×, memory-bound kernels %.2f× that table's time); "+calibrate+"\n",
			c.Unscaled.Host, c.Date, what, from, pr.GEMM, pr.Stream, what)
		return
	}
	if a.cpu.how == "own" || (c.Host == host && a.cpu.how == "") {
		return
	}
	why := ""
	if a.cpu.err != nil {
		why = fmt.Sprintf(" (probing this machine failed: %v)", a.cpu.err)
	}
	fmt.Fprintf(a.stderr, "note: the step time is timed from a calibration measured on %s (%s), not on %s (%s)%s; "+calibrate+"\n",
		c.Host, c.Date, what, host, why, what)
}

// cacheRoot is the directory shardline caches in: the cache_dir setting, or
// shardline's directory in the user cache directory ("" when there is none).
func (a *app) cacheRoot() string {
	if a.settings != nil && a.settings.CacheDir != "" {
		return a.settings.CacheDir
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "shardline")
}
