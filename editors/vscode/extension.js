// The VS Code client: starts `aplc lsp` (the path is the `aplc.path` setting) for
// documents of language `aplc` and restarts it when the settings change.
'use strict';
const vscode = require('vscode');
const { LanguageClient } = require('vscode-languageclient/node');

let client;

function start() {
  const config = vscode.workspace.getConfiguration('aplc');
  const command = config.get('path') || 'aplc';
  const server = { command, args: ['lsp'] };
  client = new LanguageClient('aplc', 'aplc', server, {
    documentSelector: [{ language: 'aplc' }],
    initializationOptions: {
      relaxed: config.get('relaxed'),
      dialect: config.get('dialect'),
    },
  });
  return client.start();
}

function activate(context) {
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (event.affectsConfiguration('aplc')) {
        if (client) await client.stop();
        await start();
      }
    }),
  );
  return start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
