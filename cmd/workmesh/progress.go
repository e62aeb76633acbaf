package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// How a batch shows its progress on stderr.
const (
	progressBar   = "bar"   // a bar redrawn in place, for a terminal
	progressLines = "lines" // a plain line now and then, for logs and pipes
	progressOff   = "off"
)

// Progress timing.
const (
	// progressTick is how often the bar is redrawn.
	progressTick = 100 * time.Millisecond
	// progressLineEvery spaces the plain lines.
	progressLineEvery = time.Second
	// barWidth is the bar's width in cells; the whole line fits 80 columns.
	barWidth = 24
)

// progressMode resolves --progress: auto is a bar when stderr is a
// terminal and plain lines otherwise.
func progressMode(flag string, stderr io.Writer) (string, error) {
	switch flag {
	case "auto":
		if isTerminal(stderr) {
			return progressBar, nil
		}
		return progressLines, nil
	case progressBar, progressLines, progressOff:
		return flag, nil
	}
	return "", usageError{fmt.Errorf("--progress %q: want auto, bar, lines or off", flag)}
}

// progress draws a batch's progress: done of total, rate, ETA, ok and
// failed. It is used from one goroutine.
type progress struct {
	w        io.Writer
	mode     string
	total    int // -1 when unknown
	start    time.Time
	last     time.Time // of the last plain line or bar drawing
	lastDone int
	drawn    bool // a bar is on the current line
}

func newProgress(w io.Writer, mode string, total int) *progress {
	now := time.Now()
	return &progress{w: w, mode: mode, total: total, start: now, last: now, lastDone: -1}
}

// update redraws the bar, or prints a plain line when one is due; final
// ends the display.
func (p *progress) update(done, ok, failed int, final bool) {
	now := time.Now()
	switch p.mode {
	case progressBar:
		if !final && p.drawn && now.Sub(p.last) < progressTick {
			return // results come faster than a terminal is worth redrawing
		}
		fmt.Fprintf(p.w, "\r\x1b[K%s", p.line(done, ok, failed, now, true))
		p.drawn, p.last = true, now
		if final {
			fmt.Fprintln(p.w)
			p.drawn = false
		}
	case progressLines:
		if done == p.lastDone && !final {
			return
		}
		if !final && now.Sub(p.last) < progressLineEvery {
			return
		}
		if final && done == p.lastDone {
			return
		}
		fmt.Fprintf(p.w, "progress: %s\n", p.line(done, ok, failed, now, false))
		p.last, p.lastDone = now, done
	}
}

// note prints a message without breaking the bar.
func (p *progress) note(msg string) {
	if p.mode == progressBar && p.drawn {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.drawn = false
	}
	fmt.Fprintln(p.w, msg)
}

// line renders the figures, with the bar in front when bar is true.
func (p *progress) line(done, ok, failed int, now time.Time, bar bool) string {
	el := now.Sub(p.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(done) / el
	}
	var b strings.Builder
	if p.total > 0 {
		frac := min(1, float64(done)/float64(p.total))
		if bar {
			fill := int(frac * barWidth)
			b.WriteString("[" + strings.Repeat("=", fill))
			if fill < barWidth {
				b.WriteString(">" + strings.Repeat(" ", barWidth-fill-1))
			}
			b.WriteString("] ")
		}
		fmt.Fprintf(&b, "%d/%d %3d%%", done, p.total, int(frac*100))
	} else {
		fmt.Fprintf(&b, "%d done", done)
	}
	fmt.Fprintf(&b, "  %.1f/s", rate)
	if p.total > 0 {
		eta := "?"
		switch {
		case done >= p.total:
			eta = "0s"
		case rate > 0:
			eta = (time.Duration(float64(p.total-done)/rate*float64(time.Second)) + time.Second/2).Truncate(time.Second).String()
		}
		fmt.Fprintf(&b, "  ETA %s", eta)
	}
	fmt.Fprintf(&b, "  ok %d  failed %d", ok, failed)
	return b.String()
}
