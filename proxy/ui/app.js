// Starts the dashboard once every view has registered itself (the shell loads core.js, then
// each view's file, then this one).
window.switchyardUI.start();
