// strata's memory map viewer: draws a strata-plan report (or one strata snapshot) embedded in this page.
// No libraries and no network: everything is drawn on canvases. Kept ASCII (the build embeds this file in a
// C++ raw string); non-ASCII characters are written as \u escapes.
'use strict';
(function () {
  var started = performance.now();
  // The planner already downsamples timelines to 2000 points; a hand-made or foreign report may not, and a
  // 400,000-point line would make every redraw slow. Per bucket we keep the maximum so no peak disappears.
  var MAX_POINTS = 2000;
  // Up to this many segments, one bar per segment (readable labels); beyond, segments flow end to end.
  var ROW_PER_SEGMENT_LIMIT = 40;
  var STREAM_COLOURS = ['#2563eb', '#7c3aed', '#0d9488', '#db2777', '#65a30d', '#0891b2', '#9333ea', '#4f46e5'];
  var FREE_COLOUR = '#e3e7ec';
  var REQUEST_COLOUR = '#d97706';
  var TIMES = '\u00d7', GEQ = '\u2265', DOT = '\u00b7', DASH = '\u2014';

  var stats = { series: 0, points: 0, maps: 0, blocks: 0, segments: 0, rects: 0 };
  var selectors = [];  // per trace: {count, select(i)}, for the self-test

  // ---------------------------------------------------------------- formatting
  var UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function fmtBytes(b) {
    if (b === null || b === undefined || !isFinite(b)) return DASH;
    var v = Math.abs(b), u = 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    var digits = u === 0 || v >= 100 ? 0 : v >= 10 ? 1 : 2;
    return (b < 0 ? '-' : '') + v.toFixed(digits) + ' ' + UNITS[u];
  }
  function fmtCount(n) {
    if (n === null || n === undefined || !isFinite(n)) return DASH;
    return Math.round(n).toLocaleString('en-US');
  }
  function fmtShort(n) {  // axis labels: 400k, 1.2M
    if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1).replace(/\.0$/, '') + 'M';
    if (n >= 1e3) return (n / 1e3).toFixed(n >= 1e4 ? 0 : 1).replace(/\.0$/, '') + 'k';
    return String(Math.round(n));
  }
  function exact(b) { return fmtCount(b) + ' bytes'; }
  function hex(n) { return '0x' + Math.round(n).toString(16); }

  // ---------------------------------------------------------------- DOM helpers
  function el(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) for (var k in attrs) {
      if (k === 'text') node.textContent = attrs[k];
      else if (k === 'cls') node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    }
    return node;
  }
  // A canvas sized in CSS pixels whose backing store matches the screen's pixel density.
  function sizeCanvas(canvas, width, height) {
    var dpr = window.devicePixelRatio || 1;
    canvas.style.width = width + 'px';
    canvas.style.height = height + 'px';
    canvas.width = Math.max(1, Math.round(width * dpr));
    canvas.height = Math.max(1, Math.round(height * dpr));
    var ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }
  var tip = document.getElementById('tip');
  function showTip(event, text) {
    tip.textContent = text;
    tip.hidden = false;
    var x = event.clientX + 14, y = event.clientY + 14;
    var r = tip.getBoundingClientRect();
    if (x + r.width > window.innerWidth - 4) x = event.clientX - r.width - 10;
    if (y + r.height > window.innerHeight - 4) y = event.clientY - r.height - 10;
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }
  function hideTip() { tip.hidden = true; }

  // ---------------------------------------------------------------- timelines
  // Returns {op, live, reserved} with at most MAX_POINTS points: each bucket keeps its largest live and
  // largest reserved, placed at the bucket's last operation.
  function downsample(tl) {
    var n = tl.op.length;
    if (n <= MAX_POINTS) return { op: tl.op, live: tl.live, reserved: tl.reserved };
    var per = Math.ceil(n / MAX_POINTS), op = [], live = [], reserved = [];
    for (var start = 0; start < n; start += per) {
      var end = Math.min(n, start + per), l = -Infinity, r = -Infinity;
      for (var i = start; i < end; i++) {
        if (tl.live[i] > l) l = tl.live[i];
        if (tl.reserved[i] > r) r = tl.reserved[i];
      }
      op.push(tl.op[end - 1]); live.push(l); reserved.push(r);
    }
    return { op: op, live: live, reserved: reserved };
  }

  // Nice axis steps in binary units: 1, 2, 5 x 10^k of the unit the largest value is written in.
  function byteTicks(max) {
    if (!(max > 0)) return [0];
    var unit = 1;
    while (max / unit >= 1024) unit *= 1024;
    var raw = max / unit / 5, pow = Math.pow(10, Math.floor(Math.log10(raw))), step = pow;
    if (raw / pow > 5) step = 10 * pow; else if (raw / pow > 2) step = 5 * pow; else if (raw / pow > 1) step = 2 * pow;
    var ticks = [];
    for (var t = 0; t <= max / unit + 1e-9; t += step) ticks.push(t * unit);
    return ticks;
  }

  function drawTimeline(canvas, series, scale, peakOp) {
    var width = canvas.parentNode.clientWidth - 16, height = 140;
    if (width < 100) width = 300;
    var ctx = sizeCanvas(canvas, width, height);
    var left = 54, right = 8, top = 6, bottom = 18;
    var w = width - left - right, h = height - top - bottom;
    function X(op) { return left + (scale.opMax > 0 ? op / scale.opMax : 0) * w; }
    function Y(b) { return top + h - (scale.yMax > 0 ? b / scale.yMax : 0) * h; }

    ctx.font = '10px "DejaVu Sans", sans-serif';
    ctx.textBaseline = 'middle';
    ctx.strokeStyle = '#edf0f3';
    ctx.fillStyle = '#7b8794';
    ctx.lineWidth = 1;
    byteTicks(scale.yMax).forEach(function (t) {
      var y = Math.round(Y(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + w, y); ctx.stroke();
      ctx.textAlign = 'right';
      ctx.fillText(fmtBytes(t), left - 4, y);
    });
    ctx.textAlign = 'left';
    ctx.textBaseline = 'top';
    ctx.fillText('0', left, top + h + 4);
    ctx.textAlign = 'right';
    ctx.fillText(fmtShort(scale.opMax) + ' ops', left + w, top + h + 4);

    var n = series.op.length;
    if (n > 0) {
      // Reserved: a filled area under a step line (memory is held until the next operation changes it).
      ctx.beginPath();
      ctx.moveTo(X(series.op[0]), Y(0));
      for (var i = 0; i < n; i++) {
        if (i > 0) ctx.lineTo(X(series.op[i]), Y(series.reserved[i - 1]));
        ctx.lineTo(X(series.op[i]), Y(series.reserved[i]));
      }
      ctx.lineTo(X(series.op[n - 1]), Y(0));
      ctx.closePath();
      ctx.fillStyle = 'rgba(240, 140, 46, 0.22)';
      ctx.fill();
      strokeSteps(ctx, series.op, series.reserved, X, Y, '#f08c2e', 1.5);
      strokeSteps(ctx, series.op, series.live, X, Y, '#2563eb', 1.2);
    }
    if (scale.capacity !== null && scale.capacity <= scale.yMax) {
      ctx.setLineDash([5, 4]);
      ctx.strokeStyle = '#d62d2d';
      ctx.lineWidth = 1.2;
      var cy = Math.round(Y(scale.capacity)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, cy); ctx.lineTo(left + w, cy); ctx.stroke();
      ctx.setLineDash([]);
    }
    if (peakOp !== null && peakOp !== undefined) {  // where the map below was taken
      ctx.setLineDash([2, 3]);
      ctx.strokeStyle = '#52606d';
      ctx.lineWidth = 1;
      var px = Math.round(X(peakOp)) + 0.5;
      ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + h); ctx.stroke();
      ctx.setLineDash([]);
    }
    canvas.onmousemove = function (event) {
      var rect = canvas.getBoundingClientRect(), x = event.clientX - rect.left;
      if (x < left || x > left + w || n === 0) { hideTip(); return; }
      var op = (x - left) / w * scale.opMax, lo = 0, hi = n - 1;
      while (lo < hi) { var mid = (lo + hi) >> 1; if (series.op[mid] < op) lo = mid + 1; else hi = mid; }
      showTip(event, 'operation ' + fmtCount(series.op[lo]) + '\nreserved ' + fmtBytes(series.reserved[lo]) +
              '\nlive ' + fmtBytes(series.live[lo]));
    };
    canvas.onmouseleave = hideTip;
  }

  function strokeSteps(ctx, ops, values, X, Y, colour, width) {
    ctx.beginPath();
    ctx.moveTo(X(ops[0]), Y(values[0]));
    for (var i = 1; i < ops.length; i++) {
      ctx.lineTo(X(ops[i]), Y(values[i - 1]));
      ctx.lineTo(X(ops[i]), Y(values[i]));
    }
    ctx.strokeStyle = colour;
    ctx.lineWidth = width;
    ctx.stroke();
  }

  // ---------------------------------------------------------------- segment maps
  function streamColour(stream) {
    if (stream === undefined || stream === null || stream < 0) return STREAM_COLOURS[0];
    return STREAM_COLOURS[(stream + 1) % STREAM_COLOURS.length];
  }

  function summarize(snapshot) {
    var s = { segments: snapshot.segments.length, blocks: 0, used: 0, free: 0, reserved: 0, inUse: 0,
              freeBytes: 0, largestFree: 0, streams: {} };
    snapshot.segments.forEach(function (seg) {
      s.reserved += seg.size;
      seg.blocks.forEach(function (b) {
        s.blocks++;
        if (b.free) { s.free++; s.freeBytes += b.size; if (b.size > s.largestFree) s.largestFree = b.size; }
        else { s.used++; s.inUse += b.size; s.streams[b.stream === undefined ? -1 : b.stream] = true; }
      });
    });
    return s;
  }

  // Where each segment goes on the canvas: a list of pieces {seg, from, to, x, y, w}; a piece shows bytes
  // [from, to) of one segment. Few segments: one row each, length by size. Many: end to end, wrapped.
  function layoutMap(segments, width) {
    var pieces = [], rowH = 18, gap = 6, labelW = 150;
    if (segments.length <= ROW_PER_SEGMENT_LIMIT) {
      var biggest = 0;
      segments.forEach(function (s) { if (s.size > biggest) biggest = s.size; });
      var barW = width - labelW - 8;
      segments.forEach(function (s, i) {
        var w = biggest > 0 ? Math.max(2, s.size / biggest * barW) : 2;
        pieces.push({ seg: i, from: 0, to: s.size, x: labelW, y: 4 + i * (rowH + gap), w: w, h: rowH });
      });
      return { pieces: pieces, height: 8 + segments.length * (rowH + gap), labels: true, labelW: labelW };
    }
    var total = 0;
    segments.forEach(function (s) { total += s.size; });
    var rows = Math.min(48, Math.max(8, Math.ceil(Math.sqrt(segments.length)))), rowW = width - 8;
    // A gap between segments where it costs little room; boundary lines (drawn later) otherwise.
    var segGap = segments.length * 3 <= 0.1 * rows * rowW ? 3 : 0;
    var perPx = total / (rows * rowW - segGap * segments.length), cursor = 0;  // cursor: pixels laid, row-major
    segments.forEach(function (s, i) {
      var from = 0;
      while (s.size - from > perPx * 1e-3) {  // what is left after rounding is not a piece
        var row = Math.floor(cursor / rowW), x = cursor - row * rowW;
        if (rowW - x < 0.5) { cursor = (row + 1) * rowW; continue; }  // no slivers at a row's end
        var take = Math.min((rowW - x) * perPx, s.size - from);
        pieces.push({ seg: i, from: from, to: from + take, x: 4 + x, y: 4 + row * (rowH + 6), w: take / perPx, h: rowH });
        cursor += take / perPx;
        from += take;
      }
      cursor += segGap;
    });
    var usedRows = Math.ceil(cursor / rowW - 1e-9);
    return { pieces: pieces, height: 8 + Math.max(1, usedRows) * (rowH + 6), labels: false, perPx: perPx, gap: segGap };
  }

  function firstBlockAt(blocks, offset) {  // the first block whose end is past `offset` (blocks sorted)
    var lo = 0, hi = blocks.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (blocks[mid].offset + blocks[mid].size <= offset) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function mix(a, b, t) {  // colour a weighted t, b weighted 1 - t; both '#rrggbb'
    function ch(c, i) { return parseInt(c.substr(1 + 2 * i, 2), 16); }
    var out = '#';
    for (var i = 0; i < 3; i++) {
      var v = Math.round(ch(a, i) * t + ch(b, i) * (1 - t));
      out += (v < 16 ? '0' : '') + v.toString(16);
    }
    return out;
  }

  // Draws one piece. Blocks of two pixels or more are drawn as rectangles; smaller ones are summed per pixel
  // column and the column is drawn once, its colour mixed by the share of bytes in use, so that a segment of
  // 20,000 blocks costs one pass over them and a few hundred rectangles.
  function drawPiece(ctx, piece, seg, request) {
    var perPx = (piece.to - piece.from) / piece.w, blocks = seg.blocks;
    ctx.fillStyle = '#c3cad3';  // bytes of the segment in no block (a page backend's unmapped tail, say)
    ctx.fillRect(piece.x, piece.y, piece.w, piece.h);
    var cols = Math.ceil(piece.w) + 1, usedBytes = null, freeBytes = null, colColour = null;
    for (var i = firstBlockAt(blocks, piece.from); i < blocks.length && blocks[i].offset < piece.to; i++) {
      var b = blocks[i], from = Math.max(b.offset, piece.from), to = Math.min(b.offset + b.size, piece.to);
      var x0 = (from - piece.from) / perPx, x1 = (to - piece.from) / perPx;
      var colour = b.free ? FREE_COLOUR : streamColour(b.stream);
      if (x1 - x0 >= 2) {
        ctx.fillStyle = colour;
        ctx.fillRect(piece.x + x0, piece.y, x1 - x0, piece.h);
        if (x1 - x0 >= 4) {  // a thin white edge keeps neighbours of one colour apart
          ctx.fillStyle = '#ffffff';
          ctx.fillRect(piece.x + x0, piece.y, 1, piece.h);
        }
        stats.rects++;
        continue;
      }
      if (!usedBytes) { usedBytes = new Float64Array(cols); freeBytes = new Float64Array(cols); colColour = []; }
      var c = Math.min(cols - 1, Math.floor((x0 + x1) / 2));
      if (b.free) freeBytes[c] += to - from;
      else { usedBytes[c] += to - from; if (!colColour[c]) colColour[c] = colour; }
    }
    if (usedBytes) for (var k = 0; k < cols; k++) {
      var total = usedBytes[k] + freeBytes[k];
      if (total <= 0) continue;
      ctx.fillStyle = mix(colColour[k] || STREAM_COLOURS[0], FREE_COLOUR, usedBytes[k] / total);
      ctx.fillRect(piece.x + k, piece.y, 1, piece.h);
      stats.rects++;
    }
    if (request) {  // the part of the free block the biggest request would take, and the block's outline
      var rFrom = Math.max(request.offset, piece.from), rTo = Math.min(request.offset + request.size, piece.to);
      var bFrom = Math.max(request.offset, piece.from), bTo = Math.min(request.blockEnd, piece.to);
      if (rTo > rFrom) {
        ctx.fillStyle = REQUEST_COLOUR;
        ctx.fillRect(piece.x + (rFrom - piece.from) / perPx, piece.y + 3, Math.max(2, (rTo - rFrom) / perPx), piece.h - 6);
      }
      if (bTo > bFrom) {
        ctx.strokeStyle = '#7c2d12';
        ctx.lineWidth = 2;
        ctx.strokeRect(piece.x + (bFrom - piece.from) / perPx + 1, piece.y + 1, Math.max(2, (bTo - bFrom) / perPx - 2), piece.h - 2);
      }
    }
  }

  function describeAt(snapshot, piece, x) {
    var seg = snapshot.segments[piece.seg], perPx = (piece.to - piece.from) / piece.w;
    var at = piece.from + (x - piece.x) * perPx, end = at + Math.max(perPx, 1);
    var lines = ['segment #' + piece.seg + '  ' + fmtBytes(seg.size) + (seg.address !== undefined ? '  at ' + hex(seg.address) : '')];
    var i = firstBlockAt(seg.blocks, at), first = i, used = 0, free = 0;
    for (; i < seg.blocks.length && seg.blocks[i].offset < end; i++) { if (seg.blocks[i].free) free++; else used++; }
    if (used + free === 0) { lines.push('offset ' + fmtBytes(at) + ': in no block'); return lines.join('\n'); }
    var b = seg.blocks[first];
    lines.push((b.free ? 'free hole' : 'used block') + ' at offset ' + fmtBytes(b.offset) + ' (' + exact(b.offset) + ')');
    lines.push('size ' + fmtBytes(b.size) + ' (' + exact(b.size) + ')');
    if (!b.free) lines.push('stream ' + (b.stream === undefined || b.stream < 0 ? 'none (not stream-ordered)' : b.stream));
    if (used + free > 1) lines.push('this pixel covers ' + fmtCount(used + free) + ' blocks: ' + fmtCount(used) + ' used, ' + fmtCount(free) + ' free');
    return lines.join('\n');
  }

  // The map of one snapshot, with the request's place (largest_request, may be null) and its words. `stack`
  // (null for a lone snapshot) is the report's entry, whose figures outrank what the snapshot suggests: a
  // page-mapped pool's segments are address ranges, and their free blocks may have no memory behind them.
  function renderMap(container, snapshot, largest, stack) {
    container.textContent = '';
    var s = summarize(snapshot);
    stats.maps++; stats.blocks += s.blocks; stats.segments += s.segments;
    var facts = fmtCount(s.segments) + ' segment' + (s.segments === 1 ? '' : 's') + ' spanning ' + fmtBytes(s.reserved) + ' ' + DOT + ' ' +
      fmtCount(s.blocks) + ' blocks (' + fmtCount(s.used) + ' used: ' + fmtBytes(s.inUse) + ', ' + fmtCount(s.free) + ' free: ' +
      fmtBytes(s.freeBytes) + ') ' + DOT + ' largest free block ' + fmtBytes(s.largestFree);
    container.appendChild(el('div', { cls: 'map-facts' }, facts));
    if (stack && typeof stack.peak_reserved === 'number' && s.reserved > stack.peak_reserved * 1.001) {
      container.appendChild(el('div', { cls: 'map-facts', text: 'The stack held ' + fmtBytes(stack.peak_reserved) + ' of memory at its peak: ' +
        'the rest of these segments is address space reserved without memory behind it (a page-mapped pool maps pages only where blocks need them).' }));
    }
    var largestFree = stack && typeof stack.largest_free_at_peak === 'number' ? stack.largest_free_at_peak : s.largestFree;
    var request = null;
    if (largest) {
      var box = el('div', { cls: 'request' });
      if (largest.segment === null || largest.segment === undefined) {
        // The map is the stack's peak, not the moment of the request: only a stack that does not fit would
        // have to find new memory it cannot have, so only there is it a warning.
        var noBlock = 'no free block ' + GEQ + ' ' + fmtBytes(largest.size) + ' (the largest free block with memory behind it is ' +
          fmtBytes(largestFree) + ')';
        if (stack && stack.fits === false) {
          box.className = 'request none';
          box.textContent = 'The biggest request of the trace, ' + fmtBytes(largest.size) + ', needs new memory at this moment: ' + noBlock + '.';
        } else {
          box.textContent = 'At this moment, ' + noBlock + ', the biggest request of the trace (' + fmtBytes(largest.size) +
            ') would take new memory' + (stack && stack.fits === true ? '; the stack fits: it never held more than its peak.' : '.');
        }
      } else {
        var seg = snapshot.segments[largest.segment], blockEnd = largest.offset + largest.size;
        var bi = seg ? firstBlockAt(seg.blocks, largest.offset) : -1;
        if (seg && bi < seg.blocks.length) blockEnd = seg.blocks[bi].offset + seg.blocks[bi].size;
        request = { seg: largest.segment, offset: largest.offset, size: largest.size, blockEnd: blockEnd };
        box.textContent = 'The biggest request of the trace, ' + fmtBytes(largest.size) + ', would go to segment #' + largest.segment +
          ' at offset ' + fmtBytes(largest.offset) + ', into a free block of ' + fmtBytes(blockEnd - largest.offset) + ' (outlined; the part it takes in amber).';
      }
      container.appendChild(box);
    }
    var legend = el('div', { cls: 'legend' });
    var streams = Object.keys(s.streams).map(Number).sort(function (a, b) { return a - b; });
    if (streams.length <= 1) legend.appendChild(el('span', null, swatch(streamColour(streams[0])), 'used block'));
    else streams.forEach(function (st) { legend.appendChild(el('span', null, swatch(streamColour(st)), st < 0 ? 'used, no stream' : 'used on stream ' + st)); });
    legend.appendChild(el('span', null, swatch(FREE_COLOUR), 'free hole'));
    if (request) legend.appendChild(el('span', null, swatch(REQUEST_COLOUR), 'biggest request'));
    legend.appendChild(el('span', null, 'hover for offset, size and stream; blocks under a pixel are mixed by the share in use'));
    container.appendChild(legend);
    if (s.segments === 0) { container.appendChild(el('p', { cls: 'empty', text: 'No memory held at this moment.' })); return; }

    var holder = el('div', { cls: 'map' }), canvas = el('canvas', { role: 'img', 'aria-label': 'memory map: ' + facts });
    holder.appendChild(canvas);
    container.appendChild(holder);
    var width = Math.max(400, holder.clientWidth || 1200), layout = layoutMap(snapshot.segments, width);
    var ctx = sizeCanvas(canvas, width, layout.height);
    canvas.strataLayout = layout;
    ctx.font = '11px "DejaVu Sans Mono", monospace';
    ctx.textBaseline = 'middle';
    layout.pieces.forEach(function (p) {
      drawPiece(ctx, p, snapshot.segments[p.seg], request && request.seg === p.seg ? request : null);
      if (layout.labels) {
        ctx.fillStyle = '#3e4c59';
        ctx.textAlign = 'left';
        ctx.fillText('#' + p.seg, 2, p.y + p.h / 2);
        ctx.textAlign = 'right';
        ctx.fillText(fmtBytes(snapshot.segments[p.seg].size), layout.labelW - 8, p.y + p.h / 2);
      }
    });
    if (!layout.labels) {
      holder.insertBefore(el('div', { cls: 'map-facts', text: fmtCount(s.segments) + ' segments laid end to end in address order and wrapped; 1 pixel = ' +
        fmtBytes(layout.perPx) + (layout.gap ? '; a gap between segments.' : '; thin dark lines: segment boundaries.') }), canvas);
      ctx.fillStyle = '#3e4c59';
      if (!layout.gap) layout.pieces.forEach(function (p) { if (p.from === 0 && p.w >= 3) ctx.fillRect(p.x, p.y - 2, 1, p.h + 4); });
    }
    canvas.onmousemove = function (event) {
      var rect = canvas.getBoundingClientRect(), x = event.clientX - rect.left, y = event.clientY - rect.top;
      for (var i = 0; i < layout.pieces.length; i++) {
        var p = layout.pieces[i];
        if (y >= p.y && y < p.y + p.h && x >= p.x && x < p.x + Math.max(p.w, 1)) { showTip(event, describeAt(snapshot, p, x)); return; }
      }
      hideTip();
    };
    canvas.onmouseleave = hideTip;
  }

  function swatch(colour) { var i = el('i'); i.style.background = colour; return i; }

  // ---------------------------------------------------------------- report
  function renderTrace(app, trace, index) {
    var section = el('section', { cls: 'trace', id: 'trace-' + index });
    var stacks = trace.stacks;
    var facts = fmtCount(trace.operations) + ' operations';
    if (trace.scale !== undefined && trace.scale !== null && trace.scale !== 1) facts += ' ' + DOT + ' sizes scaled ' + TIMES + trace.scale;
    facts += ' ' + DOT + ' ' + (trace.capacity === null || trace.capacity === undefined ? 'no capacity given' : 'capacity ' + fmtBytes(trace.capacity));
    // The file's name as the title (a trace named by a long path stays readable); the whole name on hover.
    var short = String(trace.trace).split('/').pop() || String(trace.trace);
    section.appendChild(el('div', { cls: 'trace-head' }, el('h2', { text: short, title: trace.trace }), el('span', { cls: 'facts', text: facts })));

    // Figures.
    var hasMaps = stacks.some(function (s) { return s.map_calls !== null && s.map_calls !== undefined; });
    var hasCap = trace.capacity !== null && trace.capacity !== undefined;
    var best = -1;
    stacks.forEach(function (s, i) { if (best < 0 || s.peak_reserved < stacks[best].peak_reserved) best = i; });
    var maxReserved = 0;
    stacks.forEach(function (s) { if (s.peak_reserved > maxReserved) maxReserved = s.peak_reserved; });
    var head = ['Stack', 'Peak live', 'Peak reserved', 'Reserved / live', 'Largest free at peak', 'Upstream calls'];
    if (hasMaps) head.push('Page maps / unmaps');
    if (hasCap) head.push('Fits in ' + fmtBytes(trace.capacity));
    head.push('Smallest capacity');
    var table = el('table', { cls: 'figures' }), thead = el('tr'), tbody = el('tbody');
    head.forEach(function (h) { thead.appendChild(el('th', { text: h })); });
    table.appendChild(el('thead', null, thead));
    table.appendChild(tbody);
    var rows = [];
    stacks.forEach(function (s, i) {
      var name = el('td', null, el('span', { cls: 'stack-name', text: s.name }));
      if (i === best && stacks.length > 1) name.appendChild(el('span', { cls: 'badge', text: 'least memory' }));
      if (isBaseline(s)) name.appendChild(el('span', { cls: 'badge base', text: 'baseline' }));
      if (s.description) name.appendChild(el('span', { cls: 'desc', text: s.description }));
      var bar = el('span', { cls: 'bar' });
      bar.style.width = (maxReserved > 0 ? Math.max(1, 70 * s.peak_reserved / maxReserved) : 0) + 'px';
      var tr = el('tr', null, name,
        el('td', { title: exact(s.peak_live), text: fmtBytes(s.peak_live) }),
        el('td', { title: exact(s.peak_reserved) }, bar, fmtBytes(s.peak_reserved)),
        el('td', { text: s.ratio === null || s.ratio === undefined ? DASH : s.ratio.toFixed(3) + TIMES }),
        el('td', { title: exact(s.largest_free_at_peak), text: fmtBytes(s.largest_free_at_peak) }),
        el('td', { text: fmtCount(s.upstream_calls) }));
      if (hasMaps) tr.appendChild(el('td', { text: s.map_calls === null || s.map_calls === undefined ? DASH : fmtCount(s.map_calls) + ' / ' + fmtCount(s.unmap_calls) }));
      if (hasCap) tr.appendChild(s.fits === true ? el('td', { cls: 'yes', text: 'yes' }) : s.fits === false ? el('td', { cls: 'no', text: 'no' }) : el('td', { cls: 'na', text: DASH }));
      tr.appendChild(el('td', { title: exact(s.min_capacity), text: fmtBytes(s.min_capacity) }));
      tr.onclick = function () { select(i); };
      rows.push(tr);
      tbody.appendChild(tr);
    });
    var line = headline(stacks);
    if (line) section.appendChild(el('p', { cls: 'headline', text: line }));
    section.appendChild(el('h3', { text: 'Figures (click a row to see its memory map)' }));
    section.appendChild(table);

    // Timelines: one small chart per stack, all on one scale so that heights compare.
    var opMax = trace.operations || 0, yMax = 0, series = [];
    stacks.forEach(function (s) {
      var d = downsample(s.timeline);
      series.push(d);
      stats.series += 2;  // reserved and live
      if (d.op.length > stats.points) stats.points = d.op.length;
      if (d.op.length && d.op[d.op.length - 1] > opMax) opMax = d.op[d.op.length - 1];
      for (var i = 0; i < d.op.length; i++) if (d.reserved[i] > yMax) yMax = d.reserved[i];
    });
    yMax = Math.max(yMax, maxReserved);
    var capacity = hasCap ? trace.capacity : null, capNote = '';
    if (capacity !== null) {
      if (capacity <= yMax * 1.6) yMax = Math.max(yMax, capacity);
      else capNote = ' (the capacity, ' + fmtBytes(capacity) + ', is above the charts)';
    }
    yMax *= 1.04;
    section.appendChild(el('h3', { text: 'Memory over the trace' }));
    var legend = el('div', { cls: 'legend' });
    var li = el('i'); li.style.background = 'rgba(240, 140, 46, 0.45)'; li.style.borderTop = '2px solid #f08c2e';
    legend.appendChild(el('span', null, li, 'reserved (taken from the device)'));
    var ll = el('i', { cls: 'line' }); ll.style.background = '#2563eb';
    legend.appendChild(el('span', null, ll, 'live (handed to the program)'));
    if (capacity !== null) legend.appendChild(el('span', null, el('i', { cls: 'dash' }), 'capacity' + capNote));
    legend.appendChild(el('span', null, 'dotted: the moment of the map below ' + DOT + ' same scale in every chart'));
    section.appendChild(legend);
    var charts = el('div', { cls: 'charts' });
    section.appendChild(charts);
    var canvases = stacks.map(function (s) {
      var c = el('canvas', { role: 'img', 'aria-label': s.name + ': reserved and live memory over the trace; peak reserved ' +
        fmtBytes(s.peak_reserved) + ', peak live ' + fmtBytes(s.peak_live) }), title = el('div', { cls: 'title' }, el('b', { text: s.name, title: s.description || s.name }),
        el('span', { text: 'peak ' + fmtBytes(s.peak_reserved) + ' / live ' + fmtBytes(s.peak_live) }));
      charts.appendChild(el('div', { cls: 'chart' }, title, c));
      return c;
    });

    // The map of the selected stack.
    var mapHead = el('div', { cls: 'map-head' }, el('h3', { text: 'Memory map at the peak' }));
    var chooser = el('select', { 'aria-label': 'stack whose map is shown' });
    stacks.forEach(function (s, i) { chooser.appendChild(el('option', { value: String(i), text: s.name })); });
    mapHead.appendChild(chooser);
    var when = el('span', { cls: 'facts' });
    mapHead.appendChild(when);
    section.appendChild(mapHead);
    var mapBox = el('div');
    section.appendChild(mapBox);
    app.appendChild(section);

    // Drawn after the section is in the document, so canvases know their width.
    stacks.forEach(function (s, i) {
      drawTimeline(canvases[i], series[i], { opMax: opMax, yMax: yMax, capacity: capacity }, s.peak_map ? s.peak_map.at_op : null);
    });
    function select(i) {
      chooser.value = String(i);
      rows.forEach(function (r, k) { r.className = k === i ? 'selected' : ''; });
      var pm = stacks[i].peak_map;
      if (!pm || !pm.snapshot) {
        when.textContent = '';
        mapBox.textContent = '';
        mapBox.appendChild(el('p', { cls: 'empty', text: 'The report holds no memory map for ' + stacks[i].name + '.' }));
        return;
      }
      when.textContent = stacks[i].name + ' at operation ' + fmtCount(pm.at_op) + ', its peak reserved' +
        (pm.snapshot.box && pm.snapshot.box !== stacks[i].name ? ' ' + DOT + ' the snapshot of its ' + pm.snapshot.box : '');
      renderMap(mapBox, pm.snapshot, pm.largest_request || null, stacks[i]);
    }
    chooser.onchange = function () { select(Number(chooser.value)); };
    if (stacks.length) select(0);
    selectors.push({ count: stacks.length, select: select });
  }

  function isBaseline(stack) {
    // strata-plan describes its two baselines as "baseline: ..."; other reports may only name them.
    return /^baseline/i.test(stack.description || '') || /baseline|cudamalloc|pytorch|torch/i.test(stack.name);
  }

  // The answer the report exists for: what the first (recommended) stack needs against the baselines.
  function headline(stacks) {
    var first = stacks[0];
    if (!first || isBaseline(first) || typeof first.min_capacity !== 'number') return '';
    var parts = stacks.filter(function (s) { return isBaseline(s) && typeof s.min_capacity === 'number'; }).map(function (s) {
      var more = first.min_capacity > 0 ? (s.min_capacity / first.min_capacity - 1) * 100 : 0;
      return (s.description || s.name).replace(/^baseline:\s*/i, '') + ' needs ' + fmtBytes(s.min_capacity) +
        ' (' + (more >= 0 ? '+' : '') + more.toFixed(1) + '%)';
    });
    if (!parts.length) return '';
    return first.name + ' fits in ' + fmtBytes(first.min_capacity) + '; ' + parts.join('; ') + '.';
  }

  function renderReport(app, report) {
    var traces = report.traces || [];
    app.appendChild(el('h1', { text: 'strata-plan report' }));
    app.appendChild(el('p', { cls: 'sub', text: traces.length + ' trace' + (traces.length === 1 ? '' : 's') +
      ' replayed on simulated memory through each stack. Reserved is what a stack takes from the device; live is what the program holds. ' +
      'Report format version ' + (report.version === undefined ? '?' : report.version) + '.' }));
    if (!traces.length) app.appendChild(el('p', { cls: 'empty', text: 'The report holds no traces.' }));
    traces.forEach(function (t, i) { renderTrace(app, t, i); });
  }

  function renderSnapshot(app, snapshot) {
    app.appendChild(el('h1', { text: 'strata snapshot' + (snapshot.box ? ': ' + snapshot.box : '') }));
    app.appendChild(el('p', { cls: 'sub', text: 'Every segment the pool holds from its upstream, with its blocks in address order.' }));
    var section = el('section', { cls: 'trace' });
    app.appendChild(section);
    renderMap(section, snapshot, null, null);
  }

  // ---------------------------------------------------------------- main
  var body = document.body, app = document.getElementById('app');
  try {
    var node = document.getElementById('strata-data'), kind = node.getAttribute('data-kind');
    var data = JSON.parse(node.textContent);
    if (kind === 'report') renderReport(app, data);
    else if (kind === 'snapshot') renderSnapshot(app, data);
    else throw new Error('unknown document kind "' + kind + '"');
  } catch (e) {
    window.onerror(String(e && e.message || e), '', 0);  // counted once, shown on the page
    if (window.console) console.error(e);
  }
  body.setAttribute('data-series', String(stats.series));
  body.setAttribute('data-points', String(stats.points));
  body.setAttribute('data-maps', String(stats.maps));
  body.setAttribute('data-blocks', String(stats.blocks));
  body.setAttribute('data-segments', String(stats.segments));
  body.setAttribute('data-rects', String(stats.rects));
  body.setAttribute('data-render-ms', (performance.now() - started).toFixed(1));
  body.setAttribute('data-ready-ms', performance.now().toFixed(1));  // since navigation began: parsing included
  if (body.getAttribute('data-errors') === '0') body.setAttribute('data-rendered', 'ok');
  if (location.hash === '#selftest') selfTest();

  // CI opens the page as page.html#selftest (check_viewer.sh): show every stack's map once, and hover a
  // map and a chart, so that code which only runs on interaction runs too; a script error there is counted
  // by window.onerror like any other. The tooltips' text is left on <body> for the check.
  function selfTest() {
    selectors.forEach(function (sel) {
      for (var i = 0; i < sel.count; i++) sel.select(i);
      sel.select(0);
    });
    function hover(canvas, x, y) {
      var rect = canvas.getBoundingClientRect();
      canvas.dispatchEvent(new MouseEvent('mousemove', { clientX: rect.left + x, clientY: rect.top + y, bubbles: true }));
      var text = tip.hidden ? '' : tip.textContent;
      hideTip();
      return text;
    }
    var map = document.querySelector('.map canvas');
    if (map && map.strataLayout && map.strataLayout.pieces.length) {
      var p = map.strataLayout.pieces[0];
      body.setAttribute('data-hover-map', hover(map, p.x + Math.min(p.w, 40) / 2, p.y + p.h / 2));
    }
    var chart = document.querySelector('.chart canvas');
    if (chart) body.setAttribute('data-hover-chart', hover(chart, chart.clientWidth / 2, 60));
    body.setAttribute('data-selftest', 'done');
  }
})();
