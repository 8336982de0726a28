// banlieue's browser console page (docs/console.md): a VM's serial console in xterm.js, or its
// display in noVNC, as a websocket to the console server that serves this page, carrying the
// user's Kubernetes token. The cluster decides: the server asks it who the token is and
// whether they may `get` virtualmachines/console (or /vnc) of the VM.
//
//   /console/?namespace=NS&vm=NAME&console=serial|vnc

import { Terminal } from './vendor/xterm.mjs';
import RFB from './vendor/novnc/core/rfb.js';

const TOKEN_KEY = 'banlieue.console.token';
// How a browser passes a bearer token on a websocket (as kube-apiserver takes it).
const TOKEN_PROTOCOL = 'base64url.bearer.authorization.k8s.io.';

const params = new URLSearchParams(location.search);
const namespace = params.get('namespace') || '';
const vm = params.get('vm') || '';
const kind = params.get('console') === 'vnc' ? 'vnc' : 'serial';
const what = kind === 'vnc' ? 'display' : 'serial console';
const kubectl = `kubectl vm ${kind === 'vnc' ? 'vnc' : 'console'} ${vm} -n ${namespace}`;

const $ = (id) => document.getElementById(id);

/** The session open or opening: { socket, view, opened, left }. */
let session = null;
/** What is on the screen: a session's view, which stays when the session ends. */
let shown = null;

function setState(state, status) {
  document.body.dataset.state = state;
  $('status').textContent = status;
}

function say(text) {
  $('message').textContent = text;
  $('message').hidden = !text;
}

function tokenProtocol(token) {
  let binary = '';
  for (const byte of new TextEncoder().encode(token)) {
    binary += String.fromCharCode(byte);
  }
  return TOKEN_PROTOCOL + btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function socketUrl() {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const path = `/apis/subresources.banlieue.io/v1alpha1/namespaces/${encodeURIComponent(namespace)}` +
    `/virtualmachines/${encodeURIComponent(vm)}/${kind === 'vnc' ? 'vnc' : 'console'}`;
  return `${scheme}//${location.host}${path}`;
}

/** The token form; empty, it reuses the token this tab already has. */
function ask() {
  const stored = sessionStorage.getItem(TOKEN_KEY);
  $('token').placeholder = stored ? 'empty: the same token again' : '';
  $('login').hidden = false;
  $('token').focus();
}

function open(token) {
  say('');
  $('login').hidden = true;
  shown?.dispose();
  shown = null;
  setState('connecting', 'connecting…');
  let socket;
  try {
    socket = new WebSocket(socketUrl(), [tokenProtocol(token), 'binary.k8s.io']);
  } catch (e) {
    setState('failed', 'not opened');
    say(`Could not open the ${what}: ${e.message}`);
    ask();
    return;
  }
  socket.binaryType = 'arraybuffer';
  const current = { socket, opened: false, left: false };
  socket.addEventListener('open', () => {
    current.opened = true;
    $('disconnect').hidden = false;
  });
  socket.addEventListener('close', (event) => ended(current, event));
  current.view = kind === 'vnc' ? display(socket) : serial(socket);
  session = current;
  shown = current.view;
}

function ended(current, event) {
  if (session !== current) {
    return;
  }
  session = null;
  if (current.opened) {
    current.view.end();
  } else {
    current.view.dispose();
    shown = null;
  }
  $('disconnect').hidden = true;
  $('ctrl-alt-del').hidden = true;
  if (current.left) {
    setState('closed', 'disconnected');
  } else if (!current.opened) {
    // A refusal is decided before the upgrade: the browser only sees the websocket fail.
    setState('failed', 'not opened');
    say(`Could not open the ${what} of ${namespace}/${vm}: the token is not accepted, you may not ` +
      `open it, the VM is not running, or it has no ${what} (or too many sessions are open).\n` +
      `\`${kubectl}\` says which.`);
  } else {
    setState('closed', 'closed');
    say(`The ${what} closed: ${event.reason || `code ${event.code}`}`);
  }
  ask();
}

/** The serial console: terminal bytes both ways. */
function serial(socket) {
  const screen = $('screen');
  const terminal = new Terminal({ cols: 120, rows: 36, scrollback: 10000, cursorBlink: true, fontSize: 14 });
  terminal.open(screen);
  const encoder = new TextEncoder();
  const send = (bytes) => {
    if (socket.readyState === WebSocket.OPEN) {
      socket.send(bytes);
    }
  };
  terminal.onData((data) => send(encoder.encode(data)));
  terminal.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
  socket.addEventListener('message', (event) => {
    terminal.write(typeof event.data === 'string' ? event.data : new Uint8Array(event.data));
  });
  socket.addEventListener('open', () => {
    setState('open', 'connected');
    terminal.focus();
  });
  return {
    close: () => socket.close(1000, 'the user left'),
    // What the console showed stays on the page.
    end: () => {
      terminal.options.disableStdin = true;
      terminal.options.cursorBlink = false;
    },
    dispose: () => {
      terminal.dispose();
      screen.replaceChildren();
    },
  };
}

/** The display: noVNC speaks RFB over the socket itself. */
function display(socket) {
  const screen = $('screen');
  document.body.classList.add('vnc');
  // The session is authorized already: the server answers RFB's security with None.
  const rfb = new RFB(screen, socket, { shared: true });
  rfb.scaleViewport = true;
  rfb.background = '#000';
  rfb.addEventListener('connect', () => {
    setState('open', 'connected');
    $('ctrl-alt-del').hidden = false;
    rfb.focus();
  });
  rfb.addEventListener('securityfailure', (event) => {
    say(`The display refused the session: ${event.detail.reason || `status ${event.detail.status}`}`);
  });
  rfb.addEventListener('credentialsrequired', () => {
    say('The display asks for a VNC password, which banlieue does not hand out.');
    rfb.disconnect();
  });
  rfb.addEventListener('desktopname', (event) => {
    $('what').textContent = `${what} of ${namespace}/${vm} (${event.detail.name})`;
  });
  return {
    close: () => rfb.disconnect(),
    end: () => {},
    dispose: () => screen.replaceChildren(),
    rfb,
  };
}

$('login').addEventListener('submit', (event) => {
  event.preventDefault();
  const token = $('token').value.trim() || sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    $('token').focus();
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $('token').value = '';
  open(token);
});

$('disconnect').addEventListener('click', () => {
  if (session) {
    session.left = true;
    session.view.close();
  }
});

$('ctrl-alt-del').addEventListener('click', () => session?.view.rfb?.sendCtrlAltDel());

if (!namespace || !vm) {
  setState('usage', '');
  say('Open this page as /console/?namespace=NAMESPACE&vm=NAME&console=serial (or console=vnc); ' +
    '`kubectl vm vnc NAME --browser` prints the address.');
} else {
  $('what').textContent = `${what} of ${namespace}/${vm}`;
  document.title = `${vm} (${namespace}) — banlieue console`;
  if (sessionStorage.getItem(TOKEN_KEY)) {
    open(sessionStorage.getItem(TOKEN_KEY));
  } else {
    setState('token', '');
    ask();
  }
}
